"""verl's Megatron actor worker at parallel layouts, on gloo ranks; run by tests/published/parallel/test_layouts.py.

    python tests/published/parallel/layout_child.py <plan.json>

The plan (JSON, written by the test) lists layouts, run in turn. Each names its parallel sizes (tp, pp,
ep, etp, sp), the world size, a rendezvous port, the recipe and its overrides (model and checkpoint
paths), where to write, and optionally a checkpoint to save after the first update and one to load
after the second (a resume at this layout). verl and megatron-core are imported once here (about 25 s
of CPU) and every rank is forked from this process; a rank's output goes to <out>/log<rank>.txt.

What runs is verl's own `ActorRolloutRefWorker` (role "actor") built from the recipe's composed verl
config, exactly as verl's trainer builds it on each rank, minus Ray: `init_model()` (the model for this
rank's stage and experts, the hf-to-mcore checkpoint loaded with verl's loader, the distributed
optimizer), then `compute_log_prob` / `update_actor` / `save_checkpoint` / `load_checkpoint` on this
rank's data-parallel share of one fixed batch (verl's dispatch gives data-parallel rank d the d-th of
DP equal chunks; every pipeline/tensor rank of a data-parallel group gets the same chunk).

The one departure from the trainer, for the test's sake: parameters and optimizer in fp32 (verl 0.6.0
hard-codes bf16 for the Megatron worker), so that layouts can be compared to a tight tolerance.

What every layout does, in order, is `run_steps` (the current stack's child calls it with its worker's
calls): log-probs, the same with two experts swapped, two updates, a checkpoint saved or loaded.
Writes <out>/rank<r>.pt as it goes: this rank's coordinates and share of the model, and every result.
LAYOUT_DUMP_GRADS=1 also writes each rank's gradients of the first update (grads<r>.pt), which is how
the MLA rotary-key gradient bug was located.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, REPO)


def fixed_batch(vocab: int, rows: int = 8, prompt: int = 8, response: int = 8):
    """A left-padded prompt + right-padded response batch as verl's rollout leaves it, with the
    advantages, reference log-probs and masks the actor's update reads. Deterministic.

    Every row has an even number of tokens. Megatron's MoE balancing statistics (the sequence aux loss
    and the expert-bias update) count padding tokens too, and sequence parallelism pads a micro-batch
    to a multiple of TP: with an odd longest row, TP2 + SP routes one padding token more than TP1 and
    its update legitimately differs (measured: log-probs after one step 0.05 apart). Even rows keep
    every layout's padding identical, so any difference left is the layout's."""
    g = torch.Generator().manual_seed(11)
    prompt_len = torch.randint(3, prompt + 1, (rows,), generator=g)
    resp_len = torch.randint(2, response + 1, (rows,), generator=g)
    resp_len = resp_len - (prompt_len + resp_len) % 2
    prompt_mask = torch.arange(prompt).unsqueeze(0) >= (prompt - prompt_len).unsqueeze(1)
    resp_mask = torch.arange(response).unsqueeze(0) < resp_len.unsqueeze(1)
    ids = torch.randint(4, vocab, (rows, prompt + response), generator=g)
    attention = torch.cat([prompt_mask, resp_mask], dim=1)
    ids = ids.masked_fill(~attention, 0)
    position = (attention.long().cumsum(-1) - 1).clamp(min=0)
    advantages = torch.randn(rows, 1, generator=g).expand(rows, response) * resp_mask
    ref = -4.0 + 0.1 * torch.randn(rows, response, generator=g)
    return {
        "input_ids": ids,
        "attention_mask": attention.long(),
        "position_ids": position,
        "responses": ids[:, prompt:],
        "response_mask": resp_mask.long(),
        "advantages": advantages.contiguous(),
        "ref_log_prob": ref * resp_mask,
        "old_log_probs": torch.zeros(rows, response),  # on-policy: the actor uses its own (patch 4)
    }


def fp32_worker() -> None:
    """verl 0.6.0's Megatron worker builds bf16 parameters and a bf16 optimizer unconditionally; the
    equivalence tests compare in fp32 (the same code path with another dtype)."""
    import verl.utils.megatron.optimizer as vopt
    from verl.utils.torch_dtypes import PrecisionType

    to_dtype = PrecisionType.to_dtype
    PrecisionType.to_dtype = staticmethod(
        lambda p: torch.float32 if to_dtype(p) is torch.bfloat16 else to_dtype(p)
    )
    build = vopt.init_megatron_optim_config

    def fp32_optim(optim_config):
        cfg = build(optim_config)
        cfg.bf16, cfg.params_dtype = False, torch.float32
        return cfg

    vopt.init_megatron_optim_config = fp32_optim
    import verl.workers.megatron_workers as mw

    if hasattr(mw, "init_megatron_optim_config"):
        mw.init_megatron_optim_config = fp32_optim


def rank_config(spec: dict, rank: int):
    """This process as rank `rank` of the layout `spec` (the environment torch.distributed and verl read),
    and the recipe's composed verl config for it as verl's trainer hands it to each rank's worker:
    (actor_rollout_ref config, data-parallel size, rows of the fixed batch)."""
    world = int(spec["world"])
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]), GLOO_SOCKET_IFNAME="lo",
        CUDA_VISIBLE_DEVICES="",
    )  # fmt: skip
    from omegaconf import OmegaConf

    from tools.recipes.recipe import compose, compose_verl

    cfg = compose_verl(compose(spec["recipe"], spec["overrides"]))
    arr = cfg.actor_rollout_ref
    OmegaConf.set_struct(arr, False)
    layout = spec["layout"]
    arr.actor.optim.lr = float(spec.get("lr", 1e-3))
    arr.actor.optim.total_training_steps = 10  # the trainer sets it from the data; constant lr anyway
    return arr, world // (layout["tp"] * layout["pp"]), int(spec.get("rows", 8))


def rank_coords(rank: int, chunks: list) -> tuple[dict, list]:
    """This rank's place in megatron-core's groups and the share of the model it holds (`chunks`: the
    worker's model chunks): its stage's (global, 1-based) layer numbers, the global indices of its experts
    in each MoE layer, its parameter count; and its decoder layers. `collect`: the ranks verl collects
    outputs from (TP rank 0 of the last stage)."""
    from megatron.core import parallel_state as mpu
    from verl.utils.megatron_utils import unwrap_model

    layers = list(unwrap_model(chunks[0]).decoder.layers)
    coords = {
        "rank": rank,
        "tp": mpu.get_tensor_model_parallel_rank(),
        "pp": mpu.get_pipeline_model_parallel_rank(),
        "ep": mpu.get_expert_model_parallel_rank(),
        "dp": mpu.get_data_parallel_rank(),
        "dp_size": mpu.get_data_parallel_world_size(),
        "collect": mpu.get_tensor_model_parallel_rank() == 0 and mpu.is_pipeline_last_stage(),
        "layers": [int(layer.layer_number) for layer in layers],
        "experts": {
            int(layer.layer_number): [int(i) for i in layer.mlp.local_expert_indices]
            for layer in layers
            if hasattr(layer.mlp, "local_expert_indices")
        },
        "params": sum(p.numel() for m in chunks for p in m.parameters()),
    }
    return coords, layers


def swap_two_experts(layers: list, coords: dict) -> None:
    """On expert rank 1, swap the weights of its first two experts of its first MoE layer (what a
    hand-over that places a shard at the wrong index does); calling it again swaps them back. Ranks of
    expert rank 0 (and one rank alone) hold no expert rank 1's experts: nothing changes there."""
    moe = [layer.mlp for layer in layers if hasattr(layer.mlp, "local_expert_indices")]
    if coords["ep"] != 1 or not moe:
        return
    a, b = (list(e.parameters()) for e in moe[0].experts.local_experts[:2])
    with torch.no_grad():
        for x, y in zip(a, b, strict=True):
            tmp = x.detach().clone()
            x.copy_(y)
            y.copy_(tmp)


def run_steps(
    spec, rank, dp, rows, coords, layers, worker, log_probs, update, timings, after_first_update=None
):
    """What every layout does, in order, with this stack's `log_probs()` and `update()` (and `worker`'s
    save_checkpoint / load_checkpoint): the log-probs of the fixed batch (lp0), the same with two experts
    swapped (lpX: the tolerance must catch it), an update (m1), the log-probs after it (lp1), the
    checkpoint saved when the plan says so, a second update and its log-probs (m2, lp2), and when the plan
    says so the checkpoint loaded and the second step repeated from it (lpR, m2R, lp2R). Writes
    <out>/rank<r>.pt as it goes: a later failure keeps what came before."""
    out: dict = {"coords": coords, "rows": torch.arange(rows).chunk(dp)[coords["dp"]].tolist()}
    path = os.path.join(spec["out"], f"rank{rank}.pt")

    def record(key: str, value) -> None:
        out[key] = value
        out["timings"] = timings
        torch.save(out, path)

    record("lp0", log_probs())
    swap_two_experts(layers, coords)
    record("lpX", log_probs())
    swap_two_experts(layers, coords)
    record("m1", update())
    if after_first_update is not None:
        after_first_update()
    record("lp1", log_probs())
    if spec.get("save"):
        t = time.time()
        worker.save_checkpoint(spec["save"], global_step=1)
        timings["save"] = time.time() - t
    record("m2", update())
    record("lp2", log_probs())
    if spec.get("load"):
        t = time.time()
        worker.load_checkpoint(spec["load"], del_local_after_load=False)
        timings["load"] = time.time() - t
        record("lpR", log_probs())
        record("m2R", update())
        record("lp2R", log_probs())
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run_rank(spec: dict, rank: int) -> None:
    arr, dp, rows = rank_config(spec, rank)
    # what verl's worker does for a hybrid actor (mini-batch in samples, per data-parallel rank): one
    # mini-batch of this rank's whole share, as the recipe's on-policy GRPO step
    arr.actor.ppo_mini_batch_size = rows // dp

    fp32_worker()
    from verl import DataProto
    from verl.workers.megatron_workers import ActorRolloutRefWorker

    t0 = time.time()
    worker = ActorRolloutRefWorker(arr, role="actor")
    worker.init_model()
    timings = {"init_model": time.time() - t0}
    coords, layers = rank_coords(rank, worker.actor_module)
    assert coords["dp_size"] == dp, coords
    full = fixed_batch(worker.hf_config.vocab_size, rows)
    share = {k: v.chunk(dp)[coords["dp"]].clone() for k, v in full.items()}
    tokens = share["attention_mask"].sum(-1).tolist()

    def batch() -> DataProto:
        return DataProto.from_dict(
            tensors={k: v.clone() for k, v in share.items()},
            meta_info={"temperature": 1.0, "global_token_num": tokens},
        )

    def log_probs() -> torch.Tensor:
        out = worker.compute_log_prob(batch())
        return out.batch["old_log_probs"] * share["response_mask"]

    def update() -> dict:
        m = worker.update_actor(batch()).meta_info["metrics"]
        return {k: m[k] for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm") if k in m}

    def dump_grads() -> (
        None
    ):  # LAYOUT_DUMP_GRADS=1, a debugging aid: this rank's gradients of the first update
        grads = {}
        for chunk in worker.actor_module:
            for name, p in chunk.named_parameters():
                g = getattr(p, "main_grad", None)
                grads[name] = (
                    None if g is None else g.detach().clone(),
                    getattr(p, "tensor_model_parallel", False),
                    getattr(p, "partition_dim", -1),
                )
        torch.save(grads, os.path.join(spec["out"], f"grads{rank}.pt"))

    dump = dump_grads if os.environ.get("LAYOUT_DUMP_GRADS") else None
    run_steps(spec, rank, dp, rows, coords, layers, worker, log_probs, update, timings, dump)


def run_layout(spec: dict, timeout: float, rank_fn=None) -> list[int]:
    """Fork one process per rank (the imports are paid once, in this parent); each writes its output
    to <out>/log<rank>.txt and runs `rank_fn(spec, rank)` (this stack's run_rank unless given: the current
    stack's child passes its own). Returns the exit codes; ranks still running after `timeout` are killed,
    and so is whatever a rank started and left running (each rank is a process group)."""
    rank_fn = rank_fn or run_rank

    os.makedirs(spec["out"], exist_ok=True)
    pids = []
    for rank in range(int(spec["world"])):
        pid = os.fork()
        if pid == 0:  # the rank
            code = 1
            os.setpgid(0, 0)  # its own process group: whatever it starts is ended with it (below)
            try:
                fd = os.open(
                    os.path.join(spec["out"], f"log{rank}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                )
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                rank_fn(spec, rank)
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                _end_helpers()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    codes = {}
    deadline = time.time() + timeout
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        if any(c != 0 for c in codes.values()) or time.time() > deadline:
            for pid in pids:  # a failed rank leaves the others waiting in a collective
                if pid not in codes:
                    _kill_group(pid)
                    codes[pid] = (
                        -9 if time.time() > deadline else os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                    )
        time.sleep(0.2)
    for pid in pids:  # anything a rank started and left behind (its process group outlives it)
        _kill_group(pid)
    return [codes[p] for p in pids]


def _end_helpers() -> None:
    """What the interpreter's exit would do, which the rank's os._exit skips: multiprocessing's exit
    finalizers. megatron-core's dist checkpointing starts a multiprocessing Manager (a server process,
    forked from the rank) for its write results (filesystem_async._get_write_results_queue); only this
    finalizer ends it, so without it every saving rank left one process behind (seen after the
    published stack's test: 4, one per rank of pp2ep2)."""
    import multiprocessing.util

    try:
        multiprocessing.util._exit_function()
    except Exception:  # noqa: BLE001  (best effort: _kill_group ends whatever is left)
        import traceback

        traceback.print_exc()


def _kill_group(pgid: int) -> None:
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def main(rank_fn=None, preload: str = "verl.workers.megatron_workers") -> int:
    """python tests/published/parallel/layout_child.py <plan.json>: every layout of the plan in turn.
    `preload`: the worker module imported once here, before forking the ranks."""
    import importlib

    plan = json.loads(Path(sys.argv[1]).read_text())
    importlib.import_module(preload)

    from tools.recipes.recipe import compose

    compose(plan["layouts"][0]["recipe"], plan["layouts"][0]["overrides"])  # Hydra and OmegaConf loaded
    report = []
    for spec in plan["layouts"]:
        t = time.time()
        codes = run_layout(spec, float(plan.get("timeout", 300)), rank_fn)
        report.append({"name": spec["name"], "codes": codes, "seconds": time.time() - t})
        print(json.dumps(report[-1]), flush=True)
        if any(codes):
            break
    Path(plan["report"]).write_text(json.dumps(report))
    return 0 if all(not any(r["codes"]) for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
