"""The step-time model's Setup from a composed recipe: layout, batch, hardware group, expected lengths.

Expected lengths (`launch.expect.prompt_tokens`, `launch.expect.response_tokens`):
  prompt    the recipe's value; else the training data's mean prompt (characters / 4, the usual rule of
            thumb for English text, over the first 1024 rows of data.train_files) when the file is there;
            else half of data.max_prompt_length
  response  the recipe's value; else half of data.max_response_length
  clip      `launch.expect.response_clip_ratio`, the share of responses that hit the cap (verl's
            response_length/clip_ratio): decode then runs to the cap whenever a wave holds a clipped
            response; unset, the response law is a truncated exponential from the mean (lengths.py)
Values beyond the recipe's maxima are an error that names the key.

Settings the step time depends on, read from the recipe (docs/plan-time.md):
  old log-prob pass   runs unless verl.actor_rollout_ref.actor.recompute_old_log_prob is false
                      (cann-recipes-train's verl) or verl.algorithm.rollout_correction.bypass_mode is true
                      (verl >= 0.7: the rollout's log-probs stand in)
  reshard path        launch.reshard_path: gather (verl 0.6: every rank receives the whole model, the
                      default) or shard (each rollout rank receives its own shard)
  recompute, offload, the rollout's TP x EP (DP = ranks / TP) and max_num_seqs: the verl keys below
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tools.errors import UserError
from tools.plan import hardware as H
from tools.plan import memory as M
from tools.plan.timing import Actor, Lengths, Rollout, Setup


class SetupError(UserError):
    pass


@dataclass(frozen=True)
class Expected:
    lengths: Lengths
    how: str  # where each length came from, for the printout


def _get(cfg: DictConfig, key: str, default: Any = None) -> Any:
    v = OmegaConf.select(cfg, "verl." + key, default=default)
    return default if v is None else v


def _int(cfg: DictConfig, key: str, default: int) -> int:
    v = _get(cfg, key, default)
    try:
        out = int(v)
    except (TypeError, ValueError):
        raise SetupError(
            f"verl.{key} = {v!r} is not a whole number", fix=f"set verl.{key} to an integer"
        ) from None
    if out < 1:
        raise SetupError(
            f"verl.{key} = {out} must be at least 1", fix=f"set verl.{key} to a positive integer"
        )
    return out


def data_prompt_tokens(train_files: Any) -> float | None:
    """Mean prompt length of the first 1024 training rows in tokens (characters / 4); None without data."""
    files = list(train_files) if isinstance(train_files, list | tuple) else [train_files]
    path = Path(str(files[0])) if files and files[0] else None
    if path is None or not path.is_file():
        return None
    from tools.data.parquet import ParquetError, open_parquet  # only when the recipe leaves it to the data

    try:
        pf = open_parquet(path)
    except ParquetError:
        return None  # the data rules name the damaged file
    if "prompt" not in pf.schema_arrow.names:
        return None
    rows = next(pf.iter_batches(batch_size=1024, columns=["prompt"])).to_pylist()
    chars = [sum(len(str(m.get("content", ""))) for m in r["prompt"] or []) for r in rows]
    return sum(chars) / len(chars) / 4 if chars else None


def expected(cfg: DictConfig) -> Expected:
    L = cfg.launch
    exp = L.get("expect") or {}
    p_max = _int(cfg, "data.max_prompt_length", 1)
    r_max = _int(cfg, "data.max_response_length", 1)
    p, src = exp.get("prompt_tokens"), "launch.expect.prompt_tokens"
    if p is None:
        p, src = data_prompt_tokens(_get(cfg, "data.train_files")), "the training data (characters / 4)"
        if p is None:
            p, src = p_max / 2, f"half of data.max_prompt_length {p_max} (no training data to measure)"
    r, rsrc = exp.get("response_tokens"), "launch.expect.response_tokens"
    if r is None:
        r, rsrc = r_max / 2, f"half of data.max_response_length {r_max}"
    for key, v, cap in (("prompt_tokens", p, p_max), ("response_tokens", r, r_max)):
        try:
            ok = 0 < float(v) <= cap
        except (TypeError, ValueError):
            ok = False
        if not ok:
            kind = "max_prompt_length" if key == "prompt_tokens" else "max_response_length"
            raise SetupError(
                f"launch.expect.{key} = {v!r} is not in (0, data.{kind} = {cap}]",
                fix=f"set launch.expect.{key} to the mean you expect (at most {cap}), or raise data.{kind}",
            )
    how = [f"prompt {float(p):.0f} tokens from {src}", f"response {float(r):.0f} tokens from {rsrc}"]
    clip = exp.get("response_clip_ratio")
    if clip is not None:
        try:
            lengths = Lengths.of(float(p), float(r), r_max, float(clip))
        except (TypeError, ValueError) as e:
            raise SetupError(
                f"launch.expect.response_clip_ratio = {clip!r}: {e}",
                fix="set it to the share of responses that reach data.max_response_length (0 to 1), at most "
                "launch.expect.response_tokens / data.max_response_length, or null",
            ) from None
        how.append(f"{float(clip):.1%} of the responses at the cap from launch.expect.response_clip_ratio")
        return Expected(lengths, "; ".join(how))
    return Expected(Lengths.of(float(p), float(r), r_max), "; ".join(how))


def group_of(cfg: DictConfig) -> H.Group:
    L = cfg.launch
    key = str(L.get("hardware", ""))
    chip = H.chip_for(key)
    return H.Group(
        key=key,
        chip=chip,
        nodes=int(L.nodes),
        ranks_per_node=int(L.devices_per_node),
        dies_per_device=int(L.get("dies_per_device", 1) or 1),
    )


def _recompute_layers(otc: dict, stage_max: int) -> int:
    if otc.get("recompute_granularity") != "full":
        return 0
    if otc.get("recompute_method") == "block":
        return int(otc.get("recompute_num_layers") or 0)
    return stage_max  # uniform: every layer of the stage is checkpointed and recomputed


def rollout_ep(cfg: DictConfig, arch: M.Arch, world: int, rtp: int) -> int:
    if not arch.moe:
        return 1
    ep = _get(cfg, "actor_rollout_ref.rollout.expert_parallel_size")
    if ep:
        return int(ep)
    dp = (OmegaConf.select(cfg, "launch.env", default={}) or {}).get("VLLM_DP_SIZE")
    if dp is not None and str(dp).isdigit():
        return int(dp) * rtp
    return rtp  # experts TP-sharded inside the engine: the same bytes a rank as EP = TP


def setup_of(cfg: DictConfig, lengths: Lengths | None = None) -> Setup:
    """The Setup of a composed recipe (layout errors raise SetupError naming the key)."""
    arch = M.Arch.from_config(OmegaConf.to_container(cfg.launch.model_config))
    group = group_of(cfg)
    mg = "actor_rollout_ref.actor.megatron."
    otc_node = _get(cfg, mg + "override_transformer_config")
    otc = (OmegaConf.to_container(otc_node) if OmegaConf.is_config(otc_node) else otc_node) or {}
    tp, pp = (
        _int(cfg, mg + "tensor_model_parallel_size", 1),
        _int(cfg, mg + "pipeline_model_parallel_size", 1),
    )
    ep, etp = (
        _int(cfg, mg + "expert_model_parallel_size", 1),
        _int(cfg, mg + "expert_tensor_parallel_size", 1),
    )
    stages = M.pipeline_layers(
        arch.num_hidden_layers,
        pp,
        otc.get("num_layers_in_first_pipeline_stage"),
        otc.get("num_layers_in_last_pipeline_stage"),
    )
    if stages is None or group.world % (tp * pp) or (arch.moe and group.world % (ep * etp * pp)):
        raise SetupError(
            f"the actor layout TP{tp} PP{pp} EP{ep} ETP{etp} does not divide {arch.num_hidden_layers} layers "
            f"over {group.world} ranks",
            fix="see the layout rules above",
        )
    n_train = _int(cfg, "data.train_batch_size", 1)
    mini = _int(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size", n_train)
    epochs = _int(cfg, "actor_rollout_ref.actor.ppo_epochs", 1)
    ex = lengths or expected(cfg).lengths
    mean = ex.prompt + ex.response
    mb = _int(cfg, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 1)
    lp_mb = _int(cfg, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 1)
    ref_mb = _int(cfg, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", lp_mb)
    if _get(cfg, "actor_rollout_ref.actor.use_dynamic_bsz"):  # micro-batches packed to a token budget
        budget = _int(cfg, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 1)
        mb = lp_mb = ref_mb = max(1, math.floor(budget / mean))
    npu = str(cfg.launch.get("device")) == "npu"
    actor = Actor(
        tp=tp,
        pp=pp,
        ep=ep if arch.moe else 1,
        etp=etp,
        stages=tuple(stages),
        micro_batch=mb,
        logprob_micro_batch=lp_mb,
        ref_logprob_micro_batch=ref_mb,
        recompute_layers=_recompute_layers(otc, max(stages)),
        param_offload=bool(_get(cfg, mg + "param_offload", False)),
        grad_offload=bool(_get(cfg, mg + "grad_offload", False))
        or bool(cfg.launch.get("param_offload_includes_grads") and _get(cfg, mg + "param_offload", False)),
        optimizer_offload=bool(_get(cfg, mg + "optimizer_offload", False)),
        swap_optimizer=bool(otc.get("swap_optimizer")) and npu,
        ref_param_offload=bool(_get(cfg, "actor_rollout_ref.ref.megatron.param_offload", False)),
        mini_batches=max(1, n_train // mini) * epochs,
        old_log_prob=_get(cfg, "actor_rollout_ref.actor.recompute_old_log_prob", True) is not False
        and _get(cfg, "algorithm.rollout_correction.bypass_mode", False) is not True,
    )
    path = str(cfg.launch.get("reshard_path") or "gather")
    if path not in ("gather", "shard"):
        raise SetupError(
            f"launch.reshard_path = {path!r}", fix="set launch.reshard_path to gather (verl 0.6) or shard"
        )
    rtp = _int(cfg, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1)
    rollout = Rollout(
        tp=rtp,
        ep=rollout_ep(cfg, arch, group.world, rtp),
        max_num_seqs=_int(cfg, "actor_rollout_ref.rollout.max_num_seqs", 256),
        reshard=path,
    )
    return Setup(
        arch=arch,
        group=group,
        actor=actor,
        rollout=rollout,
        prompts=n_train,
        samples=_int(cfg, "actor_rollout_ref.rollout.n", 1),
        lengths=ex,
    )
