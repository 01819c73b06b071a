"""python -m tools.selfcheck [--device auto|cpu|npu] [--model DIR]: the NPU patch series, checked.

The stack's own checks: `published` below (docs/design.md §1-6), `current` in tools/selfcheck/current.py.

Prints a table (check, form, result, figure) and exits 1 when any check fails. On a CPU machine it runs
every check's CPU form and lists the NPU forms as "needs NPU"; on an NPU node it runs the NPU forms
(and the CPU forms, which need no device).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from tools import cpu_kernels, stacks
from tools.errors import run_cli
from tools.selfcheck import current, env
from tools.selfcheck.result import FAIL, NEEDS_NPU, PASS, SKIPPED, CheckFailed, Result

# check name -> (what it proves, what the NPU form adds)
CHECKS = {
    "offload-cycle": (
        "logits equal across one offload/onload cycle",
        "a real vllm-ascend engine; device memory back to its baseline; torchair frozen parameters",
    ),
    "mla-rebuild": (
        "W_UV/W_UK_T equal ones computed from the new weights",
        "vllm-ascend's MLA implementation",
    ),
    "groups": ("DP/TP/EP groups all-reduce right, equal vLLM's", "hccl across the node's NPUs"),
    "compile": (
        "the real torch.compile under MindSpeed",
        "MindSpeed itself; torchair compiles the rollout's model",
    ),
    "kv-recreate": (
        "KV cache re-created N times keeps its block count",
        "a real engine's cache and scheduler",
    ),
}


def _run(name: str, form: str, fn: Callable[[], str]) -> Result:
    start = time.monotonic()
    try:
        figure = fn()
        result = PASS
    except CheckFailed as e:
        figure, result = str(e), FAIL
    except Exception as e:  # a crash is a failure too, with its reason
        figure, result = f"{type(e).__name__}: {e}".splitlines()[0][:300], FAIL
    return Result(f"{name} ({form})", result, f"{figure} [{time.monotonic() - start:.1f}s]")


def run(device: str, model: str | None, times: int, world: int | None, tp: int) -> list[Result]:
    env.put_trees_on_path()
    from tools.selfcheck import cpu  # imports torch: after the trees are on the path, not for --help

    results = [
        _run("offload-cycle", "cpu", cpu.offload_cycle),
        _run("mla-rebuild", "cpu", cpu.mla_rebuild),
        _run("groups", "cpu", lambda: cpu.groups(world=min(world or 4, 8), tp=tp)),
        _run("compile", "cpu", cpu.compile_real),
        _run("kv-recreate", "cpu", lambda: cpu.kv_recreate(times)),
    ]
    if device != "npu":
        for name, (_, npu_adds) in CHECKS.items():
            results.append(Result(f"{name} (npu)", NEEDS_NPU, npu_adds))
        return results
    from tools.selfcheck import npu  # imports torch (and torch_npu on a node): only on an NPU

    results.append(_run("groups", "npu", lambda: npu.groups(world, tp)))
    engine_checks = {
        "offload-cycle": lambda: npu.offload_cycle(model),
        "mla-rebuild": lambda: npu.mla_rebuild(model),
        "compile": lambda: npu.compile_real(model),
        "kv-recreate": lambda: npu.kv_recreate(model, times),
    }
    need = "needs --model DIR (a small DeepSeek-V3-architecture HF model)"
    for name, fn in engine_checks.items():
        results.append(Result(f"{name} (npu)", SKIPPED, need) if model is None else _run(name, "npu", fn))
    return results


def print_table(results: list[Result]) -> None:
    rows = [("check", "result", "figure")] + [(r.check, r.result, r.figure) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    for row in rows:
        print(f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {row[2]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.selfcheck", description=__doc__)
    parser.add_argument("--device", choices=("auto", "cpu", "npu"), default="auto")
    parser.add_argument(
        "--model", help="small DeepSeek-V3-architecture HF model dir for the NPU engine checks"
    )
    parser.add_argument("--times", type=int, default=5, help="KV-cache re-creations (default 5)")
    parser.add_argument("--world", type=int, help="ranks for the group check (default: 4 on CPU, all NPUs)")
    parser.add_argument("--tp", type=int, default=2, help="rollout TP size for the group check (default 2)")
    args = parser.parse_args(argv)
    device = env.device() if args.device == "auto" else args.device
    stack = stacks.resolve()
    print(
        f"selfcheck of stack {stack.name} on {device}"
        + ("" if device == "npu" else ": NPU forms are listed, not run"),
        flush=True,
    )
    if device != "npu":
        print(cpu_kernels.describe("native", "vllm" if stack.name == "current" else "hf"), flush=True)
    if device == "npu":
        wrong = stacks.npu_fit(stack, stacks.installed_npu_versions())
        if wrong:
            print(f"error: {wrong}", file=sys.stderr)
            return 1
    if stack.name == "current":
        results = current.run(device, args.model, args.times, _run)
    else:
        results = run(device, args.model, args.times, args.world, args.tp)
    print_table(results)
    failed = [r for r in results if r.result == FAIL]
    if failed:
        print(f"\n{len(failed)} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_cli(main)
