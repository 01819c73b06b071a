"""Preflight planner: `make plan RECIPE=...` (and `make train` before anything starts).

Every rule gives PASS, WARN, FAIL, SKIP or INFO with the values it looked at and, when it does not pass,
the fix. Rules:
  recipe   verl accepts every key; override_transformer_config keys are Megatron fields or MindSpeed args
  layout   world = nodes x devices; actor TP*PP*CP | world; EP | experts; ETP*EP*PP | world; pipeline layer
           list sums to the layer count; rollout TP | world and TP x VLLM_DP_SIZE = world; reference = actor
  batch    mini | global; (mini x n) / DP per rank, divisible by the micro-batch; log-prob micro-batches;
           prompts per rollout engine; max_num_seqs; max_num_batched_tokens >= max_model_len; Megatron
           seq_length >= prompt + response (warning); on-policy = 1 epoch and 1 mini-batch
  machine  patches applied and pins right; torch / torch_npu / CANN / transformers versions; environment
           variables (per-node *_SOCKET_IFNAME naming a real interface); data and weights present and in
           the right format (skipped with --no-env, and versions/env when the recipe's device is absent)
  memory   per-rank estimate for actor update, reference/old log-prob and rollout against the device's
           capacity (tools/launch/memory.py)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tools.errors import UserError
from tools.launch import memory as M
from tools.launch import recipe as R
from tools.stacks import detect_profile

PASS, WARN, FAIL, SKIP, INFO = "PASS", "WARN", "FAIL", "SKIP", "INFO"


@dataclass
class Result:
    group: str
    rule: str
    status: str
    values: str
    message: str = ""  # what it means; for WARN/FAIL: what to do

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclass
class Plan:
    recipe: str
    results: list[Result]
    estimate: M.Estimate | None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(r.failed for r in self.results)

    def by_rule(self, rule: str) -> Result:
        for r in self.results:
            if r.rule == rule:
                return r
        raise KeyError(rule)


class Checker:
    """Collects results; one method per rule group."""

    def __init__(self, cfg: DictConfig, *, check_machine: bool):
        self.cfg = cfg
        self.launch = cfg.launch
        self.v = cfg.verl
        self.results: list[Result] = []
        self.check_machine = check_machine
        self.estimate: M.Estimate | None = None

    def add(
        self,
        group: str,
        rule: str,
        ok: bool | None,
        values: str,
        fix: str = "",
        *,
        warn: bool = False,
        info: str = "",
    ) -> Result:
        if ok is None:
            status = SKIP
        elif ok:
            status = PASS
        else:
            status = WARN if warn else FAIL
        res = Result(group, rule, status, values, info if ok else fix)
        self.results.append(res)
        return res

    def note(self, group: str, rule: str, values: str, message: str = "") -> None:
        self.results.append(Result(group, rule, INFO, values, message))

    def skip(self, group: str, rule: str, why: str) -> None:
        self.results.append(Result(group, rule, SKIP, "-", why))

    # ---- helpers ----
    def get(self, key: str, default: Any = None) -> Any:
        value = OmegaConf.select(self.verl_full, key, default=default)
        return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value

    @property
    def arr(self):
        return self.v.actor_rollout_ref

    # ---- rules ----
    def recipe_rules(self) -> None:
        try:
            self.verl_full = R.compose_verl(self.cfg)
            self.add(
                "recipe",
                "verl accepts every key",
                True,
                f"{len(R.verl_items(self.cfg))} keys",
                info=f"composed with verl's {R.config_name(self.cfg)}.yaml",
            )
        except UserError as e:
            self.verl_full = OmegaConf.create(OmegaConf.to_container(self.v))
            self.add("recipe", "verl accepts every key", False, "-", str(e))
        if self.launch.backend == "megatron":
            from tools.launch.mcore_fields import MINDSPEED_KEYS, classify

            otc = self.get("actor_rollout_ref.actor.megatron.override_transformer_config", {}) or {}
            split = classify(list(otc), mla=self.arch.mla)
            self.add(
                "recipe",
                "transformer overrides known",
                not split["unknown"],
                f"{len(split['megatron'])} Megatron, {len(split['mindspeed'])} MindSpeed, "
                f"unknown: {split['unknown'] or 'none'}",
                "verl drops a key (Megatron)TransformerConfig lacks with only a warning: fix the spelling "
                "(megatron/core/transformer/transformer_config.py) or list it in "
                "tools/launch/mcore_fields.py MINDSPEED_KEYS if MindSpeed reads it",
            )
            if split["mindspeed"] and self.launch.device != "npu":
                self.add(
                    "recipe",
                    "MindSpeed arguments without MindSpeed",
                    False,
                    ", ".join(split["mindspeed"]),
                    f"device is {self.launch.device}: no MindSpeed, verl drops these keys "
                    f"({'; '.join(MINDSPEED_KEYS[k] for k in split['mindspeed'][:3])}...)",
                    warn=True,
                )
        for key, why in (self.launch.get("deviations") or {}).items():
            self.note("recipe", "deviation from the published run", f"verl.{key}", " ".join(str(why).split()))

    def megatron_version(self) -> str:
        """The megatron-core release the recipe's stack pins (patches/<stack>/upstreams.toml)."""
        from tools.patches.config import load_upstreams

        pin = load_upstreams(R.REPO, self.launch.stack)["megatron"].pypi
        return pin.version if pin else "(unpinned)"

    def pipeline_rules(self, num_layers: int, pp: int, otc: dict) -> list[int] | None:
        """The layers of each pipeline stage, from Megatron's first/last-stage keys or MindSpeed's
        per-stage list (pipeline_num_transformer_layers), checked against each other; None when wrong."""
        first_key, last_key, list_key = (
            "num_layers_in_first_pipeline_stage",
            "num_layers_in_last_pipeline_stage",
            "pipeline_num_transformer_layers",
        )
        first, last = otc.get(first_key), otc.get(last_key)
        megatron = M.pipeline_layers(num_layers, pp, first, last)
        given = otc.get(list_key)
        if given is None:
            self.add(
                "layout",
                "pipeline layers sum to the layer count",
                megatron is not None and sum(megatron) == num_layers and min(megatron) > 0,
                f"{megatron} = {sum(megatron) if megatron else '?'} of {num_layers} layers "
                f"(PP{pp}, first {first}, last {last})",
                f"with PP{pp}: {num_layers} - first - last must split evenly over the "
                f"{max(pp - (first is not None) - (last is not None), 0)} middle stages "
                f"(override_transformer_config.{first_key}/{last_key}, or {list_key}=[...] with one entry "
                "a stage)",
            )
            return megatron
        try:
            listed = M.stage_list(given)
        except ValueError as e:
            self.add(
                "layout", "pipeline layers sum to the layer count", False, f"{list_key}={given!r}",
                f"{e}: give one entry a stage, e.g. [6,8,8,8,8,8,8,7] (or [[6],[8],...] with virtual stages)",
            )  # fmt: skip
            return None
        ok = len(listed) == pp and sum(listed) == num_layers and min(listed, default=0) > 0
        self.add(
            "layout",
            "pipeline layers sum to the layer count",
            ok,
            f"{listed} = {sum(listed)} of {num_layers} layers (PP{pp}, {list_key}: {len(listed)} entries)",
            f"override_transformer_config.{list_key} needs PP={pp} entries, each > 0, summing to "
            f"{num_layers}; it has {len(listed)} summing to {sum(listed)}",
        )
        if not ok:
            return None
        # megatron-core (0.12.1 and 0.16.1 alike) builds each stage from the first/last-stage keys
        # (transformer_block.get_num_layers_to_build), which verl passes to Megatron on every device;
        # MindSpeed (NPU) reads the list as well. Both must describe the same stages.
        mcore = f"megatron-core {self.megatron_version()}"
        expressible = pp == 1 or len(set(listed[1:-1])) <= 1
        want_first = listed[0] if pp > 1 and listed[0] != listed[min(1, pp - 1)] else None
        want_last = listed[-1] if pp > 1 and listed[-1] != listed[max(pp - 2, 0)] else None
        if pp > 2 and not expressible:
            fix = (
                f"{mcore} places only an uneven first and last stage (even middle stages): "
                f"{listed} cannot be built; make the middle stages equal"
            )
            agree = False
        elif megatron == listed:
            agree, fix = True, ""
        else:
            agree = False
            keys = " ".join(
                f"{k}={v}" for k, v in ((first_key, want_first), (last_key, want_last)) if v is not None
            )
            fix = (
                f"{mcore} builds the stages from {first_key}/{last_key} (now first {first}, "
                f"last {last}: {megatron or f'{num_layers} layers do not split over PP{pp}'}), not from "
                f"{list_key}: set {keys or 'both to null'} in override_transformer_config, as the published "
                "run does"
            )
        self.add(
            "layout",
            "Megatron's first/last-stage keys match the layer list",
            agree,
            f"{list_key} {listed}; {first_key} {first}, {last_key} {last}",
            fix,
        )
        return listed if agree else None

    def layout_rules(self) -> None:
        L, a = self.launch, self.arch
        world = int(L.nodes) * int(L.devices_per_node)
        nn, ng = self.get("trainer.nnodes"), self.get("trainer.n_gpus_per_node")
        self.world = world
        self.add(
            "layout",
            "world = nodes x devices",
            (nn, ng) == (L.nodes, L.devices_per_node),
            f"{L.nodes} x {L.devices_per_node} = {world}; verl trainer {nn} x {ng}",
            "set verl.trainer.nnodes/n_gpus_per_node to ${launch.nodes}/${launch.devices_per_node}",
        )
        self.layout = M.Layout(world=world, stages=[a.num_hidden_layers])
        if L.backend == "megatron":
            mg = "actor_rollout_ref.actor.megatron."
            tp, pp = (
                int(self.get(mg + "tensor_model_parallel_size", 1)),
                int(self.get(mg + "pipeline_model_parallel_size", 1)),
            )
            cp = int(self.get(mg + "context_parallel_size", 1))
            ep, etp = (
                int(self.get(mg + "expert_model_parallel_size", 1)),
                int(self.get(mg + "expert_tensor_parallel_size", 1) or 1),
            )
            ok = world % (tp * pp * cp) == 0
            self.add(
                "layout",
                "actor TP x PP x CP divides world",
                ok,
                f"TP{tp} x PP{pp} x CP{cp} = {tp * pp * cp}, world {world}"
                + (f", DP {world // (tp * pp * cp)}" if ok else ""),
                "choose tensor/pipeline/context parallel sizes whose product divides nodes x devices",
            )
            if a.moe:
                self.add(
                    "layout",
                    "actor EP divides the experts",
                    a.n_routed_experts % ep == 0,
                    f"{a.n_routed_experts} experts / EP{ep}"
                    + (f" = {a.n_routed_experts // ep} a rank" if a.n_routed_experts % ep == 0 else ""),
                    f"expert_model_parallel_size must divide {a.n_routed_experts}",
                )
                self.add(
                    "layout",
                    "ETP x EP x PP divides world",
                    world % (etp * ep * pp) == 0,
                    f"ETP{etp} x EP{ep} x PP{pp} = {etp * ep * pp}, world {world}"
                    + (f", expert-DP {world // (etp * ep * pp)}" if world % (etp * ep * pp) == 0 else ""),
                    "megatron-core needs world % (ETP*EP*PP) == 0: lower EP or ETP",
                )
            elif ep > 1:
                self.add(
                    "layout",
                    "EP on a dense model",
                    False,
                    f"EP{ep}",
                    "set expert_model_parallel_size=1",
                    warn=True,
                )
            otc = self.get(mg + "override_transformer_config", {}) or {}
            stages = self.pipeline_rules(a.num_hidden_layers, pp, otc)
            if stages:
                self.layout = M.Layout(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, stages=stages)
                gran, meth, n = (
                    otc.get("recompute_granularity"),
                    otc.get("recompute_method"),
                    otc.get("recompute_num_layers"),
                )
                if gran == "full" and meth == "block":
                    self.add(
                        "layout",
                        "recompute block fits a stage",
                        n is not None and 0 < n <= max(stages),
                        f"recompute_num_layers {n}, stage layers {sorted(set(stages))}",
                        "block recompute counts layers per stage: at most the largest stage",
                        warn=True,
                        info="stages with fewer layers recompute all of them",
                    )
            ref = "actor_rollout_ref.ref.megatron."
            same = all(
                self.get(ref + k, 1) == self.get(mg + k, 1)
                for k in (
                    "tensor_model_parallel_size",
                    "pipeline_model_parallel_size",
                    "expert_model_parallel_size",
                )
            )
            self.add(
                "layout",
                "reference uses the actor's layout",
                same,
                f"ref TP{self.get(ref + 'tensor_model_parallel_size')} PP{self.get(ref + 'pipeline_model_parallel_size')} "
                f"EP{self.get(ref + 'expert_model_parallel_size')}",
                "the colocated reference shares the actor's process groups: set ref.megatron sizes "
                "equal to actor.megatron's",
                warn=True,
            )
        rname = self.get("actor_rollout_ref.rollout.name")
        rtp = int(self.get("actor_rollout_ref.rollout.tensor_model_parallel_size", 1))
        self.rollout_tp = rtp
        self.add(
            "layout",
            "rollout TP divides world",
            world % rtp == 0,
            f"TP{rtp}, world {world}",
            "rollout.tensor_model_parallel_size must divide nodes x devices",
        )
        self.add(
            "layout",
            "rollout TP divides attention heads",
            a.num_attention_heads % rtp == 0,
            f"{a.num_attention_heads} heads / TP{rtp}",
            "pick a rollout TP that divides the head count",
        )
        self.rollout_ep = 1
        if rname == "vllm" and self.launch.get("rollout_mode") == "server":
            self.server_rollout_rules(world, rtp)
        elif rname == "vllm":
            env = R.verl_env(self.cfg)
            dp = env.get("VLLM_DP_SIZE")
            ok = dp is not None and dp.isdigit() and int(dp) * rtp == world
            self.add(
                "layout",
                "rollout TP x VLLM_DP_SIZE = world",
                ok,
                f"TP{rtp} x VLLM_DP_SIZE {dp} = {int(dp) * rtp if dp and dp.isdigit() else '?'}, world {world}",
                f"set launch.env.VLLM_DP_SIZE={world // rtp if world % rtp == 0 else '?'} "
                "(= world / rollout TP); otherwise expert parallelism silently shrinks to the TP group",
            )
            if ok:
                self.rollout_ep = int(dp) * rtp if self.arch.moe else 1
                self.rollout_experts_rule()

    def server_rollout_rules(self, world: int, rtp: int) -> None:
        """verl's server-mode rollout (current stack): replicas of TP x DP x PP ranks, vLLM's own DP and EP."""
        ro = "actor_rollout_ref.rollout."
        dp = int(self.get(ro + "data_parallel_size", 1) or 1)
        pp = int(self.get(ro + "pipeline_model_parallel_size", 1) or 1)
        ep = int(self.get(ro + "expert_parallel_size", 1) or 1)
        replica = rtp * dp * pp
        self.add(
            "layout",
            "rollout replica TP x DP x PP divides world",
            world % replica == 0,
            f"TP{rtp} x DP{dp} x PP{pp} = {replica}, world {world}"
            + (f", {world // replica} replica(s)" if world % replica == 0 else ""),
            "choose rollout tensor/data/pipeline parallel sizes whose product divides nodes x devices",
        )
        self.add(
            "layout",
            "rollout EP = TP x DP (or 1)",
            ep in (1, rtp * dp),
            f"EP{ep}, TP{rtp} x DP{dp} = {rtp * dp}",
            f"set rollout.expert_parallel_size={rtp * dp} (experts over the replica's ranks) or 1 (TP-sharded experts)",
        )
        env = R.verl_env(self.cfg)
        self.add(
            "layout",
            "no VLLM_DP_SIZE with server-mode rollout",
            "VLLM_DP_SIZE" not in env,
            f"VLLM_DP_SIZE={env.get('VLLM_DP_SIZE')}" if "VLLM_DP_SIZE" in env else "unset",
            "verl passes rollout.data_parallel_size to vLLM itself: drop launch.env.VLLM_DP_SIZE "
            "and set verl.actor_rollout_ref.rollout.data_parallel_size",
            warn=True,
        )
        if ep > 1 and self.arch.moe:
            self.rollout_ep = ep
            self.rollout_experts_rule()

    def rollout_experts_rule(self) -> None:
        a = self.arch
        if a.moe:
            self.add(
                "layout",
                "rollout EP divides the experts",
                a.n_routed_experts % self.rollout_ep == 0,
                f"{a.n_routed_experts} experts / EP{self.rollout_ep}",
                "vLLM spreads the remainder unevenly: prefer an EP group that divides the experts",
                warn=True,
            )

    def batch_rules(self) -> None:
        g = self.get
        B = int(g("data.train_batch_size"))
        n = int(g("actor_rollout_ref.rollout.n", 1))
        mini = int(g("actor_rollout_ref.actor.ppo_mini_batch_size"))
        micro = g("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
        dp = self.layout.dp if self.launch.backend == "megatron" else self.world
        self.add(
            "batch",
            "mini-batch divides the batch",
            B % mini == 0,
            f"{B} prompts / mini {mini}",
            "data.train_batch_size must be a multiple of actor.ppo_mini_batch_size",
        )
        if dp < 1:  # the actor's model parallelism needs more ranks than the world has: layout rules say so
            self.skip("batch", "per-rank batch rules", "the actor layout does not fit the world (see layout)")
            return
        per_rank = mini * n / dp
        ok = per_rank == int(per_rank) and per_rank > 0
        self.add(
            "batch",
            "mini-batch x n divides over DP",
            ok,
            f"{mini} x {n} / DP{dp} = {per_rank:g} a rank",
            f"ppo_mini_batch_size x rollout.n must be a multiple of the actor's DP size {dp}",
        )
        if ok and micro:
            self.add(
                "batch",
                "micro-batch divides the rank's mini-batch",
                int(per_rank) % int(micro) == 0,
                f"{int(per_rank)} / micro {micro}"
                + (
                    f" = {int(per_rank) // int(micro)} micro-batches"
                    if int(per_rank) % int(micro) == 0
                    else ""
                ),
                "ppo_micro_batch_size_per_gpu must divide (mini x n / DP)",
            )
        total = B * n
        for who in ("rollout", "ref"):
            lp = g(f"actor_rollout_ref.{who}.log_prob_micro_batch_size_per_gpu")
            if lp:
                per = total / dp
                self.add(
                    "batch",
                    f"{who} log-prob micro-batch divides",
                    per == int(per) and int(per) % int(lp) == 0,
                    f"{B} x {n} / DP{dp} = {per:g} a rank, micro {lp}",
                    f"actor_rollout_ref.{who}.log_prob_micro_batch_size_per_gpu must divide (batch x n / DP)",
                )
        rdp = self.world // self.rollout_tp if self.world % self.rollout_tp == 0 else None
        if rdp:
            self.add(
                "batch",
                "prompts split over rollout engines",
                B % rdp == 0,
                f"{B} prompts / {rdp} engines" + (f" = {B // rdp} each" if B % rdp == 0 else ""),
                f"data.train_batch_size must be a multiple of world / rollout TP = {rdp}",
            )
            if g("actor_rollout_ref.rollout.name") == "vllm" and B % rdp == 0:
                seqs = B // rdp * n
                mns = int(g("actor_rollout_ref.rollout.max_num_seqs"))
                res = self.add(
                    "batch",
                    "max_num_seqs covers an engine's sequences",
                    mns >= seqs,
                    f"max_num_seqs {mns}, {B // rdp} prompts x {n} = {seqs} a engine",
                    f"generation runs in {-(-seqs // mns)} waves: raise max_num_seqs to {seqs} "
                    "(costs KV cache) or accept the slower generation",
                    warn=True,
                )
                if mns > seqs:
                    res.message = f"{mns - seqs} slots never used: {seqs} is enough (graph batch size too)"
                    res.status = INFO
                self.max_num_seqs = mns
        P, Rl = int(g("data.max_prompt_length")), int(g("data.max_response_length"))
        mml = g("actor_rollout_ref.rollout.max_model_len") or P + Rl
        self.seq, self.max_model_len = P + Rl, int(mml)
        if g("actor_rollout_ref.rollout.name") == "vllm":
            mbt = int(g("actor_rollout_ref.rollout.max_num_batched_tokens"))
            chunked = bool(g("actor_rollout_ref.rollout.enable_chunked_prefill"))
            values = (
                f"max_num_batched_tokens {mbt}, max_model_len {mml} (prompt {P} + response {Rl}), "
                f"chunked prefill {'on' if chunked else 'off'}"
            )
            if self.launch.get("rollout_mode") == "server":
                # verl 0.9.1 raises the budget to max_model_len itself when chunked prefill is off
                # (vllm_async_server.py _validate_configs); with it on, a smaller budget splits prefills
                self.add(
                    "batch",
                    "max_num_batched_tokens >= max_model_len",
                    mbt >= mml or chunked,
                    values,
                    "with chunked prefill off a prompt longer than one batch cannot be scheduled",
                    info="one prefill batch holds a whole sequence"
                    if mbt >= mml
                    else "chunked prefill splits longer prompts",
                )
            else:
                self.add(
                    "batch",
                    "max_num_batched_tokens >= max_model_len",
                    mbt >= mml,
                    values,
                    f"set rollout.max_num_batched_tokens >= {mml}: with chunked prefill on, verl 0.6.0 raises "
                    "(vllm_rollout_spmd.py: 'max_num_batched_tokens is smaller than max_model_len'); with it "
                    "off, vLLM and vllm-ascend's ascend scheduler refuse a prompt longer than one batch",
                    info="one prefill batch holds a whole sequence",
                )
        if self.launch.backend == "megatron":
            otc = g("actor_rollout_ref.actor.megatron.override_transformer_config", {}) or {}
            sl = otc.get("seq_length")
            if sl is not None:
                self.add(
                    "batch",
                    "Megatron seq_length >= prompt + response",
                    int(sl) >= P + Rl,
                    f"seq_length {sl}, prompt {P} + response {Rl} = {P + Rl}",
                    "known quirk of the published run: verl packs sequences itself, so MindSpeed's "
                    f"seq_length only sizes buffers; set it to {P + Rl} unless you reproduce the run",
                    warn=True,
                )
        epochs = int(g("actor_rollout_ref.actor.ppo_epochs", 1))
        single = epochs == 1 and mini == B
        want = bool(self.launch.get("on_policy", False))
        values = f"ppo_epochs {epochs}, {B // mini if B % mini == 0 else '?'} mini-batch(es) a step"
        if want:
            self.add(
                "batch",
                "on-policy (single mini-batch)",
                single,
                values,
                "launch.on_policy needs ppo_epochs=1 and ppo_mini_batch_size = train_batch_size: only "
                "then the old log-probs equal the current ones (PATCHES.md section 4)",
                info="old log-prob = current log-prob, importance ratio exactly 1",
            )
        else:
            self.note(
                "batch",
                "on-policy (single mini-batch)",
                values,
                "on-policy path active" if single else "off-policy: stored old log-probs are used",
            )

    # ---- the machine ----
    def machine_rules(self) -> None:
        if not self.check_machine:
            for rule in (
                "patches applied, pins right",
                "versions",
                "environment variables",
                "data",
                "weights",
            ):
                self.skip("machine", rule, "--no-env")
            return
        self.patch_rules()
        here = detect_profile()
        target = self.launch.device
        if target != here:
            why = f"recipe runs on {target}, this machine has {here}: run `make plan` on a node"
            self.skip("machine", "versions", why)
            self.skip("machine", "environment variables", why)
        else:
            self.version_rules()
            self.env_rules()
        self.data_rules()
        self.weight_rules()

    def patch_rules(self) -> None:
        try:
            from tools.patches import config as pc
            from tools.patches import manager

            ups = pc.load_upstreams(R.REPO)
            here = detect_profile()
            need = [n for n, u in ups.items() if self.launch.device in u.install]
            if self.launch.device != here:
                elsewhere = [n for n in need if here not in ups[n].install]
                if elsewhere:
                    self.skip(
                        "machine",
                        "patches for " + ", ".join(elsewhere),
                        f"only the {self.launch.device} profile has these trees: check on a node",
                    )
                need = [n for n in need if here in ups[n].install]
            rows = {n: manager.status(ups[n]) for n in need if n in ups}
            bad = {
                n: r["patches"]
                for n, r in rows.items()
                if not re.fullmatch(r"(\d+)/\1 applied", r["patches"])
            }
            self.add(
                "machine",
                "patches applied",
                not bad,
                ", ".join(f"{n} {r['patches']}" for n, r in rows.items()),
                "run `make apply-patches` (or `make bootstrap`): "
                + "; ".join(f"{n}: {p}" for n, p in bad.items()),
            )
            problems = pc.check_pins(R.REPO)
            self.add(
                "machine",
                "pins right",
                not problems,
                "stacks' upstreams.toml = gitlinks = .gitmodules" if not problems else problems[0],
                "; ".join(problems),
            )
        except Exception as e:  # the patch manager's own errors are user errors with fixes
            self.add("machine", "patches applied", False, "-", str(e))

    def version_rules(self) -> None:
        """The stack's versions: on an NPU node CANN, torch-npu and torch as patches/stacks.toml names them
        (naming the stack that fits when they differ); every profile's environment as its lock pins it."""
        from tools import stacks

        stack = stacks.load(R.REPO)[self.launch.stack]
        if self.launch.device == "npu":
            found = stacks.installed_npu_versions()
            wrong = stacks.npu_fit(stack, found, R.REPO)
            self.add(
                "machine",
                "versions: CANN, torch-npu, torch",
                wrong is None,
                ", ".join(f"{k} {found.get(k) or 'missing'}" for k in stack.npu) + f" (stack {stack.name})",
                wrong or "",
            )
        self.lock_rule(stack.name)

    def lock_rule(self, stack: str) -> None:
        from importlib import metadata

        from tools.env import lock

        spec = lock.profile_spec(stack, self.launch.device)
        pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", (R.REPO / spec.path).read_text(), re.M))
        differ = []
        for name, want in pins.items():
            try:
                have = metadata.version(name)
            except metadata.PackageNotFoundError:
                have = None
            if have != want:
                differ.append(f"{name} {have or 'missing'} (lock {want})")
        self.add(
            "machine",
            "versions: the environment is the lock",
            not differ,
            f"{len(pins) - len(differ)} of {len(pins)} as {spec.path} pins them"
            + (f"; {', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}" if differ else ""),
            f"run `make bootstrap STACK={stack} PROFILE={self.launch.device}`",
        )

    def env_rules(self) -> None:
        env = R.verl_env(self.cfg)
        clash = {k: (os.environ[k], v) for k, v in env.items() if k in os.environ and os.environ[k] != v}
        self.add(
            "machine",
            "environment variables",
            not clash,
            f"{len(env)} set by the recipe"
            + (f"; differing in your shell: {sorted(clash)}" if clash else ""),
            "the recipe's values win for the run; unset or align: "
            + ", ".join(f"{k}={mine!r} (recipe {theirs!r})" for k, (mine, theirs) in clash.items()),
            warn=True,
        )
        if int(self.launch.nodes) > 1:
            for var in self.launch.get("node_env") or []:
                val = os.environ.get(var) or env.get(var)
                ok = bool(val) and Path("/sys/class/net", val).exists()
                self.add(
                    "machine",
                    f"{var}",
                    ok,
                    f"{var}={val}",
                    f"export {var}=<the interface of the cluster network on this node> "
                    f"(one of: {', '.join(sorted(os.listdir('/sys/class/net')))})",
                )

    def _prepare_fix(self) -> str:
        made_by = self.launch.paths.get("made_by")
        return f"run {made_by}" if made_by else f"run `make prepare RECIPE={self.launch.recipe}`"

    def data_rules(self) -> None:
        from tools.data.parquet import ParquetError, data_fix, open_parquet
        from tools.data.schema import SCHEMA

        keyed = [  # (the recipe's key, a file it names)
            (f"verl.data.{k}", f)
            for k in ("train_files", "val_files")
            for x in [self.get(f"data.{k}")]
            for f in (x if isinstance(x, list) else [x])
            if f
        ]
        files = [f for _, f in keyed]
        paths = self.launch.get("paths") or {}

        def fix(key: str, f: str) -> str:  # the recipe's own tooling where it makes the file, else make data
            return data_fix(f, key, paths.get("data"), self._prepare_fix(), paths.get("raw_data"))

        missing = [(k, f) for k, f in keyed if not Path(f).is_file()]
        if missing:
            self.add("machine", "data present", False, ", ".join(f for _, f in missing), fix(*missing[0]))
            return
        problems, rows, bad = [], 0, None
        for k, f in keyed:
            try:
                pf = open_parquet(f)  # an empty, truncated or garbage file: named, with what is wrong
            except ParquetError as e:
                problems.append(str(e))
                bad = bad or (k, f)
                continue
            schema = pf.schema_arrow
            for field in SCHEMA:
                if field.name not in schema.names:
                    problems.append(f"{f}: no column {field.name!r}")
                    bad = bad or (k, f)
            rows += pf.metadata.num_rows
        self.add(
            "machine",
            "data present, verl's schema",
            not problems,
            f"{len(files)} files, {rows} rows",
            "; ".join(problems[:3]) + (f"; {fix(*bad)}" if bad else ""),
        )
        train_files = self.get("data.train_files")
        if not problems and train_files:
            self.steps_rule(train_files)

    def steps_rule(self, train_files: Any) -> None:
        """More steps asked than the data has batches for: verl would end early without a word."""
        asked = self.get("trainer.total_training_steps")
        if asked is None:
            return
        b = data_batches(
            train_files,
            int(self.get("data.gen_batch_size") or self.get("data.train_batch_size")),
            int(self.get("trainer.total_epochs") or 1),
        )
        self.add(
            "batch",
            "steps <= batches in the data",
            int(asked) <= b.total,
            f"{asked} steps; {b.describe()}",
            steps_fix(
                self.launch.recipe, self.launch.stack, self.launch.get("overrides") or [], int(asked), b
            ),
        )

    def weight_rules(self) -> None:
        paths = self.launch.paths
        hf = Path(str(self.get("actor_rollout_ref.model.path")))
        fix = self._prepare_fix()
        cfg_file = hf / "config.json"
        if not cfg_file.is_file():
            self.add("machine", "weights present", False, f"{cfg_file} missing", fix)
            return
        conf = json.loads(cfg_file.read_text())
        issues = []
        if conf.get("quantization_config"):
            issues.append("config.json declares quantization_config (verl refuses): make fix-config")
        if conf.get("num_nextn_predict_layers", 0):
            issues.append(
                f"num_nextn_predict_layers={conf['num_nextn_predict_layers']} (verl refuses MTP): make fix-config"
            )
        for k, want in OmegaConf.to_container(self.launch.model_config).items():
            if k in conf and conf[k] != want:
                issues.append(f"config.json {k}={conf[k]} but recipe launch.model_config.{k}={want}")
        shards = list(hf.glob("*.safetensors"))
        if not shards:
            issues.append(f"no *.safetensors in {hf}")
        if not any((hf / t).is_file() for t in ("tokenizer.json", "tokenizer.model")):
            issues.append(f"no tokenizer.json in {hf}")
        self.add(
            "machine",
            "HF weights, format",
            not issues,
            f"{hf}: {len(shards)} shards",
            "; ".join(issues) + f" ({fix})",
        )
        for role in ("actor", "ref"):
            if self.get(f"actor_rollout_ref.{role}.megatron.use_dist_checkpointing"):
                ck = Path(str(self.get(f"actor_rollout_ref.{role}.megatron.dist_checkpointing_path")))
                ok = (
                    (ck / ".metadata").is_file()
                    or (ck / "iter_0000000" / ".metadata").is_file()
                    or any(ck.glob("*/.metadata"))
                )
                self.add(
                    "machine",
                    f"{role} Megatron checkpoint",
                    ok,
                    str(ck),
                    f"no torch_dist checkpoint (.metadata) there: make convert-mcore SRC={paths.get('hf_model')} "
                    f"DST={ck}, or {fix}",
                )

    # ---- memory ----
    def memory_rules(self) -> None:
        L, g = self.launch, self.get
        cap = int(float(L.device_memory_gib) * M.GIB)
        if L.backend != "megatron":
            self.skip("memory", "device memory", "the estimate covers the Megatron backend")
            return
        bad_layout = [r.rule for r in self.results if r.group == "layout" and r.status == FAIL]
        if bad_layout:
            self.skip("memory", "device memory", f"fix the layout first ({'; '.join(bad_layout)})")
            return
        mg = "actor_rollout_ref.actor.megatron."
        otc = g(mg + "override_transformer_config", {}) or {}
        name = g("actor_rollout_ref.rollout.name")
        try:
            est = M.estimate(
                self.arch,
                self.layout,
                capacity_bytes=cap,
                seq=self.seq,
                micro_batch=int(g("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") or 1),
                logprob_micro_batch=int(
                    g("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu") or 1
                ),
                ref_logprob_micro_batch=int(
                    g("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu") or 1
                ),
                param_offload=bool(g(mg + "param_offload")),
                grad_offload=bool(g(mg + "grad_offload"))
                or bool(L.get("param_offload_includes_grads") and g(mg + "param_offload")),
                optimizer_on_host=bool(otc.get("swap_optimizer")) and L.device == "npu",
                optimizer_offload=bool(g(mg + "optimizer_offload")),
                ref_param_offload=bool(g("actor_rollout_ref.ref.megatron.param_offload")),
                full_recompute=otc.get("recompute_granularity") == "full",
                rollout_tp=self.rollout_tp,
                rollout_ep=self.rollout_ep,
                gpu_memory_utilization=float(g("actor_rollout_ref.rollout.gpu_memory_utilization"))
                if name == "vllm"
                else 0.0,
                max_num_seqs=int(g("actor_rollout_ref.rollout.max_num_seqs")) if name == "vllm" else 0,
                max_model_len=self.max_model_len,
                max_num_batched_tokens=int(g("actor_rollout_ref.rollout.max_num_batched_tokens"))
                if name == "vllm"
                else 0,
                npu=L.device == "npu",
            )
        except (ZeroDivisionError, ValueError) as e:
            self.skip("memory", "device memory", f"layout not valid for an estimate ({e})")
            return
        if name != "vllm":  # the HF rollout shares the actor's weights: no separate pool
            est.phases = [ph for ph in est.phases if not ph.name.startswith("rollout")]
        self.estimate = est
        for ph in est.phases:
            ok = ph.ratio <= 0.9
            self.add(
                "memory",
                ph.name,
                ok if ph.ratio <= 1.0 else False,
                f"{ph.total / M.GIB:.1f} of {cap / M.GIB:.0f} GiB ({ph.ratio:.0%})",
                "over 90% of the device: little headroom for fragmentation"
                if ph.ratio <= 1.0
                else "over capacity: turn on param/grad offload, the swap optimizer or optimizer_offload, "
                "raise PP/EP, or lower the micro-batch",
                warn=ph.ratio <= 1.0,
                info=", ".join(f"{p.name} {p.bytes / M.GIB:.1f}" for p in ph.parts if p.bytes),
            )
        if name == "vllm":
            ok = est.kv_available >= est.kv_needed
            self.add(
                "memory",
                "KV cache holds max_num_seqs x max_model_len",
                ok if est.kv_available > 0 else False,
                f"needs {est.kv_needed / M.GIB:.1f} GiB, pool leaves {est.kv_available / M.GIB:.1f} GiB",
                "vLLM will preempt and recompute sequences: raise gpu_memory_utilization (if the rest "
                "fits), offload more, or lower max_num_seqs"
                if est.kv_available > 0
                else "no room for any KV cache: the rollout weights alone exceed the pool",
                warn=est.kv_available > 0,
            )

    def run(self) -> None:
        mc = OmegaConf.to_container(self.launch.model_config)
        self.arch = M.Arch.from_config(mc)
        self.recipe_rules()
        self.layout_rules()
        self.batch_rules()
        self.machine_rules()
        self.memory_rules()


@dataclass(frozen=True)
class Batches:
    rows: int  # training rows
    batch: int  # prompts a step
    epochs: int

    @property
    def per_epoch(self) -> int:  # verl's train dataloader drops the last partial batch
        return self.rows // self.batch

    @property
    def total(self) -> int:
        return self.per_epoch * self.epochs

    def describe(self) -> str:
        return (
            f"the data has {self.rows} training rows // {self.batch} prompts a step = {self.per_epoch} batches "
            f"an epoch x {self.epochs} epochs = {self.total} batches"
        )


def data_batches(train_files: Any, batch: int, epochs: int) -> Batches:
    """How many training steps the data feeds (rows of every train file, verl's drop-last batches)."""
    from tools.data.parquet import open_parquet

    files = train_files if isinstance(train_files, list | tuple) else [train_files]
    rows = sum(open_parquet(str(f)).metadata.num_rows for f in files)
    return Batches(rows, batch, epochs)


def train_command(recipe: str, stack: str, args: str = "") -> str:
    """`make train` for `recipe` on `stack`, naming the stack when it is not the default (the command must
    run as printed)."""
    from tools import stacks

    named = "" if stack == stacks.default().name else f" STACK={stack}"
    return f"make train{named} RECIPE={recipe}" + (f" ARGS='{args}'" if args else "")


def steps_fix(recipe: str, stack: str, overrides: list[str], asked: int, b: Batches) -> str:
    """The command that gives `asked` steps enough data: more epochs (or fewer steps)."""
    need = -(-asked // max(1, b.per_epoch)) if b.per_epoch else None
    keep = [
        o for o in overrides if not o.split("=", 1)[0].lstrip("+").startswith("verl.trainer.total_epochs")
    ]
    if need is None:
        return f"the data has fewer rows ({b.rows}) than one batch ({b.batch}): more data or a smaller batch"
    args = " ".join([*keep, f"verl.trainer.total_epochs={need}"])
    return (
        f"verl would stop after {b.total} steps: {train_command(recipe, stack, args)} "
        f"(or ask for at most {b.total} steps)"
    )


def plan(
    recipe: str, overrides: list[str] = (), *, check_machine: bool = True, stack: str | None = None
) -> Plan:
    t0 = time.perf_counter()
    cfg = R.compose(recipe, overrides, stack=stack)
    ch = Checker(cfg, check_machine=check_machine)
    ch.run()
    return Plan(recipe, ch.results, ch.estimate, time.perf_counter() - t0)


# ---- output ----
MARK = {PASS: "ok", WARN: "WARN", FAIL: "FAIL", SKIP: "skip", INFO: "info"}


def render(p: Plan, width: int | None = None) -> str:
    width = width or max(100, min(shutil.get_terminal_size((140, 20)).columns, 160))
    rule_w = max(len(r.rule) for r in p.results)
    rule_w = min(rule_w, 44)
    head = f"{'':5} {'rule':<{rule_w}}  values / what to do"
    lines = [f"preflight for recipe {p.recipe}", head, "-" * min(width, len(head) + 60)]
    group = None
    text_w = max(40, width - rule_w - 8)
    for r in p.results:
        if r.group != group:
            group = r.group
            lines.append(f"[{group}]")
        vals = textwrap.wrap(r.values, text_w) or [""]
        lines.append(f"{MARK[r.status]:<5} {r.rule:<{rule_w}}  {vals[0]}")
        lines += [f"{'':5} {'':<{rule_w}}  {v}" for v in vals[1:]]
        if r.message and r.status in (WARN, FAIL, SKIP, INFO):
            arrow = "fix: " if r.status in (WARN, FAIL) else ""
            for i, m in enumerate(textwrap.wrap(arrow + r.message, text_w)):
                lines.append(f"{'':5} {'':<{rule_w}}  {'  ' if i else ''}{m}")
    if p.estimate:
        unit, div = ("GiB", M.GIB) if p.estimate.phases[0].capacity >= 16 * M.GIB else ("MiB", 1024**2)
        lines.append("")
        lines.append(f"memory per rank ({unit}), estimated (tools/launch/memory.py):")
        for ph in p.estimate.phases:
            lines.append(f"  {ph.name}: {ph.total / div:.1f} of {ph.capacity / div:.0f}")
            for part in ph.parts:
                if part.bytes:
                    lines.append(
                        f"    {part.bytes / div:8.2f}  {part.name}"
                        + (f"  ({part.note})" if part.note else "")
                    )
    counts = {s: sum(r.status == s for r in p.results) for s in (PASS, WARN, FAIL, SKIP, INFO)}
    lines.append("")
    lines.append(
        f"{'PASS' if p.ok else 'FAIL'}: {counts[PASS]} ok, {counts[WARN]} warnings, {counts[FAIL]} failures, "
        f"{counts[SKIP]} skipped ({p.seconds:.2f} s)"
    )
    return "\n".join(lines)


def main(args) -> int:
    p = plan(args.recipe, args.overrides, check_machine=not args.no_env)
    print(render(p))
    if args.json:
        from tools import atomic

        atomic.write_json(
            Path(args.json),
            {"recipe": p.recipe, "ok": p.ok, "seconds": p.seconds, "results": [asdict(r) for r in p.results]},
        )
    return 0 if p.ok else 1


if __name__ == "__main__":
    sys.exit(main(None))
