"""A resumed run is the run that never stopped: tiny-cpu (current stack) stopped or faulted at each moment that
matters, then resumed or restarted, against an uninterrupted run of the same recipe and seed.

    python bench/bench_faults.py [--cases sync-a sync-b generation update save worker-killed stall async-a ...]
                                                                            (make bench-faults)

Each case is one fresh run folder (3 GRPO steps, a checkpoint each step, no validation):
- sync-a, sync-b: uninterrupted, twice (the run-to-run noise floor);
- generation, update, save: Ctrl-C to `make train` while step 2 generates, updates the actor, or saves its
  checkpoint (tests/faults/sitecustomize.py's moments, tests/current/test_stop_e2e.py's `stop_at`), then a
  plain `make train` of the same run folder, which resumes from the last sealed checkpoint up to step 3;
- worker-killed: the Megatron actor worker killed with SIGKILL after step 1, `launch.restarts=1`: the
  launcher restarts by itself (tools/launch/restart.py);
- stall: one reward call hangs after step 1 (tests/faults/stall_once_reward.py), `launch.restarts=1`,
  `launch.watchdog.stall_s=40`: the watchdog names the stall, the launcher restarts by itself (the time to the
  restarted run's first step counts from the hang, detection included);
- async-a, sync-stop: `mode=separate_async` uninterrupted, and SIGTERM in its weight sync after step 1 (the
  actor sending over the gloo engine), then resumed.
Per case it prints: all 3 steps finished; the prompts each step trained on (<run>/prompts.jsonl) identical to
the reference's (sync: sync-a's, and verl's own sampler's; separate_async: async-a's); the largest absolute
difference of any weight of the final checkpoint (the actor's bf16 Megatron model, global_step_3) from the
reference's; and the seconds from the fault (the signal, the kill) to the next step's row. Results go to
<out>/bench-faults.json as each case ends; a case can be re-run alone (--cases).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from tests import train_e2e as e2e  # noqa: E402
from tests.current import test_stop_e2e as stops  # noqa: E402
from tools.launch import checkpoints, prompt_record  # noqa: E402

STACK = "current"
STEPS = 3
RUN = (f"launch.steps={STEPS}", "verl.trainer.total_epochs=20", "verl.trainer.save_freq=1",
       "verl.trainer.val_before_train=false", "verl.trainer.test_freq=-1")  # fmt: skip
ROW = re.compile(r"^\s+(\d+)\s+[\d.]+\s")  # a row of make train's step table
CASES = ["sync-a", "sync-b", "generation", "update", "save", "worker-killed", "stall", "async-a", "sync-stop",
         "seeded-a", "seeded-b", "seeded-generation", "control-no-data-pt"]  # fmt: skip
# the stall: one reward call hangs after step 1 (tests/faults/stall_once_reward.py); the watchdog names it after
# STALL_S without a new log line or step, and the run restarts from step 1's checkpoint
STALL_S = 40
STALL_REWARD = REPO / "tests" / "faults" / "stall_once_reward.py"
# the control: a resume that has lost verl's dataloader state (data.pt removed, the checkpoint sealed again):
# the comparison must say "no" for it, or it could not see a resume that skips or repeats prompts
CONTROL = "control-no-data-pt"
ASYNC = ("async-a", "sync-stop")
SEEDED = ("seeded-a", "seeded-b", "seeded-generation")
# a seed on every rollout request (tools/verl_plugins/seeded_agent_loop.py), opt-in; its module is imported by
# name in verl's agent loop worker, so the repository goes on PYTHONPATH (Ray passes the environment on)
SEEDED_ARGS = (
    f"+verl.actor_rollout_ref.rollout.agent.agent_loop_config_path={REPO}/tools/verl_plugins/seeded_agent_loop.yaml",
    "+verl.actor_rollout_ref.rollout.agent.default_agent_loop=seeded_single_turn_agent",
)


def reference_of(case: str) -> str:
    return "async-a" if case in ASYNC else "seeded-a" if case in SEEDED else "sync-a"


def folder(out: Path, case: str) -> Path:
    return out / case / "outputs" / STACK / "tiny-cpu"


def first_row_after(run: e2e.Run, since_line: int, timeout: float) -> float:
    """When make train printed its next step row after output line `since_line` (time.time())."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(ROW.match(line) for line in run.lines[since_line:]):
            return time.time()
        if run.proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError("no step came after the fault:\n" + run.text()[-3000:])


def uninterrupted(out: Path, case: str, *args: str) -> dict[str, Any]:
    t = time.time()
    run = e2e.Run(STACK, out / case / "outputs", {}, *RUN, *args, base=())
    rc, _, text = run.finish(timeout=1800)
    if rc != 0:
        raise RuntimeError(f"{case}: exit {rc}\n" + text[-3000:])
    return {"wall_s": round(time.time() - t, 1)}


def stopped_then_resumed(
    out: Path, case: str, moment: str, sig: signal.Signals, call: int, *args: str, lose_data_pt: bool = False
) -> dict:
    """A run stopped at `moment` (its `call`-th time there), then `make train` again up to step STEPS
    (`lose_data_pt`: the control, with verl's dataloader state removed from the checkpoint first)."""
    outputs = out / case / "outputs"
    s = stops.stop_at(outputs, moment, sig, "verl.trainer.test_freq=-1", *args, call=call)
    if s.rc != 128 + sig:
        raise RuntimeError(f"{case}: the stop ended with {s.rc}\n" + s.out[-3000:])
    kept = max((r["step"] for r in e2e.metrics(s.run) if r["kind"] == "train"), default=0)
    if lose_data_pt:
        step_dir = s.run / "checkpoints" / f"global_step_{kept}"
        (step_dir / "data.pt").unlink()
        checkpoints.write_manifest(step_dir)
    run = e2e.Run(STACK, outputs, {}, *RUN[1:], f"launch.steps={STEPS - kept}", *args, base=())
    next_step = first_row_after(run, 0, 1800)
    rc, _, text = run.finish(timeout=1800)
    if rc != 0:
        raise RuntimeError(f"{case}: the resumed run ended with {rc}\n" + text[-3000:])
    return {"stopped_after_step": kept, "fault_to_next_step_s": round(next_step - s.signalled, 1),
            "stop_exit_s": round(s.exited - s.signalled, 1)}  # fmt: skip


def worker_killed(out: Path, case: str) -> dict[str, Any]:
    run = e2e.Run(STACK, out / case / "outputs", {}, *RUN, "launch.restarts=1", base=())
    run.wait_for("tok/s/dev", timeout=1800)  # step 1's row: trained and saved
    workers = [
        p for p in run.seen if p.is_running() and p.cmdline()[:1] and p.cmdline()[0].startswith("ray::")
    ]
    since = len(run.lines)
    max(workers, key=lambda p: p.memory_info().rss).send_signal(signal.SIGKILL)
    killed = time.time()
    next_step = first_row_after(run, since, 1800)
    rc, _, text = run.finish(timeout=1800)
    if rc != 0:
        raise RuntimeError(f"{case}: exit {rc}\n" + text[-3000:])
    return {"fault_to_next_step_s": round(next_step - killed, 1)}


def weights(run: Path, step: int = STEPS, part: str = "model") -> dict[str, torch.Tensor]:
    """The actor's weights in checkpoint `step` (torch.distributed.checkpoint's own reader): `model`, the bf16
    Megatron model; `optimizer`, the distributed optimizer's fp32 main parameters (where each update lands
    before it is rounded to bf16)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(
            run / "checkpoints" / f"global_step_{step}" / "actor" / part / "dist_ckpt", f"{tmp}/m.pt"
        )
        state = torch.load(f"{tmp}/m.pt", weights_only=False)
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    return tensors if part == "model" else {k: v for k, v in tensors.items() if k.endswith(".param")}


def weight_difference(a: Path, b: Path, step_a: int = STEPS, step_b: int = STEPS) -> dict[str, float]:
    """Per part (bf16 model, fp32 main parameters): the largest absolute difference of any weight, and the
    share of weights that differ at all."""
    out = {}
    for part, name in (("model", "bf16"), ("optimizer", "fp32")):
        wa, wb = weights(a, step_a, part), weights(b, step_b, part)
        if wa.keys() != wb.keys() or not wa:
            raise RuntimeError(f"{a} and {b}: different {part} tensors")
        diffs = [(wa[k].float() - wb[k].float()).abs() for k in wa]
        total = sum(d.numel() for d in diffs)
        out[f"{name}_max"] = max(float(d.max()) for d in diffs)
        out[f"{name}_differing"] = sum(int((d > 0).sum()) for d in diffs) / total
    return out


def compare(out: Path, case: str, reference: str) -> dict[str, Any]:
    run, ref = folder(out, case), folder(out, reference)
    trained = sorted(r["step"] for r in e2e.metrics(run) if r["kind"] == "train")
    rows = prompt_record.read(run)
    cfg = OmegaConf.load(run / "config.yaml")
    n = int(OmegaConf.select(cfg, "verl.actor_rollout_ref.rollout.n"))
    want = {int(r["step"]): r["prompts"] for r in prompt_record.read(ref)}
    problems = prompt_record.compare(rows, want, n)
    if case not in ASYNC:  # sync: also verl's own sampler, computed afresh
        problems += [
            p for p in prompt_record.compare(rows, prompt_record.expected(cfg, STEPS), n) if p not in problems
        ]
    result: dict[str, Any] = {
        "steps_finished": trained == list(range(1, STEPS + 1)),
        "trained_steps": trained,
        "prompts_identical": not problems and len(rows) == STEPS,
        "prompt_problems": problems,
        "prompts": [r["prompts"] for r in rows],
    }
    if case != reference:
        result["difference"] = weight_difference(run, ref)
        result["max_weight_difference"] = result["difference"]["bf16_max"]
    else:  # the scale: how far steps 2 and 3 moved the weights
        result["moved_from_step_1"] = weight_difference(run, run, STEPS, 1)
    return result


def stalled(out: Path, case: str) -> dict[str, Any]:
    trigger = out / case / "stall-trigger"
    trigger.parent.mkdir(parents=True, exist_ok=True)
    claimed = Path(f"{trigger}.claimed")
    claimed.unlink(missing_ok=True)
    run = e2e.Run(STACK, out / case / "outputs", {"ASCEND_R1_STALL_TRIGGER": str(trigger)}, *RUN,
                  "launch.restarts=1", f"launch.watchdog.stall_s={STALL_S}",
                  f"verl.custom_reward_function.path={STALL_REWARD}",
                  f"verl.reward.custom_reward_function.path={STALL_REWARD}", base=())  # fmt: skip
    run.wait_for("tok/s/dev", timeout=1800)  # step 1's row: trained and saved
    since = len(run.lines)
    trigger.write_text("")
    deadline = time.time() + 1800
    while not claimed.exists():  # the next reward call takes the trigger and hangs
        if time.time() > deadline:
            raise RuntimeError(f"{case}: no reward call took {trigger}")
        time.sleep(0.2)
    stalled_at = claimed.stat().st_mtime
    # the hang may come in the step after the one whose row prints next: the next step is the restart's first
    run.wait_for("restart after attempt", timeout=1800)
    restarted = next(i for i in range(since, len(run.lines)) if "restart after attempt" in run.lines[i])
    next_step = first_row_after(run, restarted, 1800)
    rc, _, text = run.finish(timeout=1800)
    if rc != 0:
        raise RuntimeError(f"{case}: exit {rc}\n" + text[-3000:])
    if "stall" not in text:
        raise RuntimeError(f"{case}: the run finished without naming a stall\n" + text[-3000:])
    return {"fault_to_next_step_s": round(next_step - stalled_at, 1), "stall_s": STALL_S}


def run_case(out: Path, case: str) -> dict[str, Any]:
    t = time.time()
    if (out / case).exists():  # a case run again starts afresh: make train would resume its old run folder
        print(f"  replacing the case's earlier runs: {out / case}", flush=True)
        shutil.rmtree(out / case)
    if case in ("sync-a", "sync-b"):
        result = uninterrupted(out, case)
    elif case in ("generation", "update", "save"):
        result = stopped_then_resumed(out, case, case, signal.SIGINT, 2)
    elif case == "worker-killed":
        result = worker_killed(out, case)
    elif case == "stall":
        result = stalled(out, case)
    elif case == "async-a":
        result = uninterrupted(out, case, "mode=separate_async")
    elif case == "sync-stop":
        result = stopped_then_resumed(out, case, "sync", signal.SIGTERM, 2, "mode=separate_async")
    elif case == CONTROL:
        result = stopped_then_resumed(out, case, "update", signal.SIGINT, 2, lose_data_pt=True)
    elif case in SEEDED:
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), path]))
        try:
            if case == "seeded-generation":
                result = stopped_then_resumed(out, case, "generation", signal.SIGINT, 2, *SEEDED_ARGS)
            else:
                result = uninterrupted(out, case, *SEEDED_ARGS)
        finally:
            if path is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = path
    else:
        raise SystemExit(f"error: no case {case!r}; the cases: {', '.join(CASES)}")
    reference = reference_of(case)
    result.update(compare(out, case, reference), reference=reference, case_s=round(time.time() - t, 1))
    return result


def _diff(d: dict[str, float] | None) -> tuple[str, str]:
    if not d:
        return "-", "-"
    return tuple(f"{d[f'{n}_max']:.3g} ({100 * d[f'{n}_differing']:.3g}% differ)" for n in ("bf16", "fp32"))  # type: ignore[return-value]


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| case | against | all steps finished | prompts identical | weights, step 3: bf16 model, max abs difference"
             " | fp32 main parameters | fault to next step |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for case, r in results.items():
        if "error" in r:
            lines.append(f"| {case} | | error: {r['error'][:100]} | | | | |")
            continue
        own = r["reference"] == case
        sampler = "" if case in ASYNC else "verl's sampler; "
        against = f"{sampler}itself at step 1 (the update's own size)" if own else r["reference"]
        if case == CONTROL:
            against += " (the control: data.pt removed before the resume; the prompts must differ)"
        steps = "yes" if r["steps_finished"] else f"no: {r['trained_steps']}"
        prompts = "yes" if r["prompts_identical"] else "no: " + "; ".join(r["prompt_problems"])[:120]
        bf16, fp32 = _diff(r.get("moved_from_step_1") if own else r.get("difference"))
        to_next = r.get("fault_to_next_step_s")
        lines.append(f"| {case} | {against} | {steps} | {prompts} | {bf16} | {fp32} "
                     f"| {'-' if to_next is None else f'{to_next:.0f} s'} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "bench-faults")
    ap.add_argument(
        "--compare-only", action="store_true", help="compare the cases' run folders again, no runs"
    )
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "bench-faults.json"
    results: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}
    for case in a.cases:
        if a.compare_only and not (folder(a.out, case) / "checkpoints").is_dir():
            continue
        print(f"== {case} ({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})", flush=True)
        try:
            if a.compare_only:
                reference = reference_of(case)
                results[case] = {
                    **results.get(case, {}),
                    **compare(a.out, case, reference),
                    "reference": reference,
                }
            else:
                results[case] = run_case(a.out, case)
        except Exception as exc:  # noqa: BLE001 - a failed case is reported in the table, the others still run
            results[case] = {"error": f"{type(exc).__name__}: {exc}"}
        path.write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps(results[case])[:2000], flush=True)
    order = {c: i for i, c in enumerate(CASES)}
    print(table(dict(sorted(results.items(), key=lambda kv: order.get(kv[0], 99)))))
    bad = [c for c, r in results.items()
           if "error" in r or not r["steps_finished"] or r["prompts_identical"] == (c == CONTROL)]  # fmt: skip
    if bad:
        print(f"not as an uninterrupted run: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
