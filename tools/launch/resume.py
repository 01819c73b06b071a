"""Which checkpoint a `make train` resumes from, verified before any worker starts, and records that agree.

`prepare(run, ...)` is called by the launcher before verl starts:

1. picks the checkpoint: `--fresh` none; `--resume-from=N` global_step_N; otherwise the step of verl's tracker
   file (`latest_checkpointed_iteration.txt`). Folders after the tracker's step (a save cut off) are skipped,
   and a line says so. The tracker's checkpoint without a manifest (verl finished it, the launcher never
   sealed it: tools.launch.checkpoints) stops the run with the choices: seal it, the last sealed one, --fresh.
2. verifies it against its manifest. A missing, truncated or changed file stops the run before anything
   starts, naming the file, and offers the last intact checkpoint (`--resume-from=N`) and `--fresh`. It does
   not fall back by itself: damage to a sealed checkpoint means the storage lost data after the save, which a
   person should see, and falling back silently would throw away steps that cost cluster hours; the fix is
   one command.
3. moves every `global_step_M` with M past the chosen step aside, into `checkpoints/dropped/<time>/` (kept,
   not deleted: verl would otherwise write the new steps over them and mix two runs in one folder), and
   points verl's tracker at the chosen step (atomically), so that verl resumes from exactly what was verified.
4. reconciles the records: records of steps after the chosen one leave `metrics.jsonl` (appended to
   `metrics.jsonl.dropped`), `steps.md` and the plots are redrawn, and one line says what was kept and dropped.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from tools import atomic, stacks
from tools.analysis import learning
from tools.launch import prompt_record
from tools.launch.checkpoints import (
    CheckpointError,
    intact_below,
    read_manifest,
    step_dirs,
    tracked_step,
    verify,
    write_tracker,
)

Log = Callable[[str], None]


def train_command(recipe: str, stack: str, args: list[str]) -> str:
    """`make train` as a user types it for this run, with ARGS."""
    named = "" if stack == stacks.default().name else f" STACK={stack}"
    joined = " ".join(args)
    return f"make train{named} RECIPE={recipe}" + (f" ARGS='{joined}'" if joined else "")


def _verified(d: Path, step: int, dirs: dict[int, Path], cmd: Callable, log: Log) -> int:
    """`step` once checkpoint `d` matches its manifest; else the CheckpointError naming the damage."""
    t = time.time()
    problems = verify(d)
    if problems:
        raise _damaged(d, problems, dirs, cmd)
    log(f"checkpoint {d.name}: verified against its manifest ({time.time() - t:.1f} s)")
    return step


def _damaged(
    d: Path, problems: list[str], dirs: dict[int, Path], cmd: Callable[[list[str]], str]
) -> CheckpointError:
    n = int(d.name.rsplit("_", 1)[1])
    prev = intact_below(dirs, n)
    more = (
        f" (and {len(problems) - 1} more file(s): python -m tools.launch.checkpoints verify {d})"
        if len(problems) > 1
        else ""
    )
    fixes = []
    if prev is not None:
        fixes.append(f"resume from the last intact checkpoint, step {prev}: {cmd([f'--resume-from={prev}'])}")
    fixes.append(f"start over: {cmd(['--fresh'])}")
    return CheckpointError(f"checkpoint {d} is damaged: {problems[0]}{more}", fix="; or ".join(fixes))


def choose(
    ckpt: Path, fresh: bool, resume_from: int | None, cmd: Callable[[list[str]], str], log: Log
) -> int:
    """The verified step to resume from (0: start afresh). Raises CheckpointError for a damaged one."""
    dirs = step_dirs(ckpt)
    if fresh:
        return 0
    if resume_from is not None:
        d = dirs.get(resume_from)
        if d is None:
            have = [n for n, p in dirs.items() if read_manifest(p) is not None]
            raise CheckpointError(
                f"no checkpoint {ckpt}/global_step_{resume_from}",
                fix=f"pick one of the sealed steps {have}"
                if have
                else f"no sealed checkpoint there: {cmd(['--fresh'])}",
            )
        if read_manifest(d) is None:
            raise CheckpointError(
                f"checkpoint {d} has no manifest: its save did not finish under the launcher",
                fix=f"if you trust it: python -m tools.launch.checkpoints seal {d}; or start over: {cmd(['--fresh'])}",
            )
        return _verified(d, resume_from, dirs, cmd, log)
    tracker = tracked_step(ckpt)
    if tracker is None:
        for d in dirs.values():
            log(f"checkpoint {d.name}: verl's tracker file is missing, so no save finished: not used")
        return 0
    for n in sorted(dirs, reverse=True):
        d = dirs[n]
        if n > tracker:
            log(f"checkpoint {d.name}: its save did not finish (verl's tracker says {tracker}): not used")
            continue
        if read_manifest(d) is None:
            # verl finished it (the tracker says so) but the launcher never sealed it: stopped before it
            # could, or an older launcher saved it. Whether to trust it is the user's call, not a silent one.
            prev = intact_below(dirs, n)
            fixes = [f"if you trust it: python -m tools.launch.checkpoints seal {d}, then run again"]
            if prev is not None:
                fixes.append(
                    f"resume from the last sealed, intact checkpoint, step {prev}: {cmd([f'--resume-from={prev}'])}"
                )
            fixes.append(f"start over: {cmd(['--fresh'])}")
            raise CheckpointError(
                f"checkpoint {d} has no manifest: verl finished it (its tracker says {tracker}) but the launcher "
                "did not seal it (stopped before it could, or an older launcher ran), so it is not verified",
                fix="; or ".join(fixes),
            )
        return _verified(d, n, dirs, cmd, log)
    return 0


def set_aside(ckpt: Path, step: int, log: Log) -> list[Path]:
    """Move every global_step_M with M > step into checkpoints/dropped/<time>/ and point the tracker at step."""
    later = [d for n, d in step_dirs(ckpt).items() if n > step]
    moved = []
    if later:
        dest = Path(ckpt) / "dropped" / time.strftime("%Y%m%d-%H%M%S")
        while dest.exists():
            dest = dest.with_name(dest.name + "+")
        dest.mkdir(parents=True)
        for d in later:
            shutil.move(str(d), dest / d.name)
            moved.append(dest / d.name)
        log(f"checkpoints after step {step} moved aside (kept): {', '.join(d.name for d in later)} -> {dest}")
    if Path(ckpt).is_dir() and (step or tracked_step(ckpt) is not None):
        write_tracker(ckpt, step)
    return moved


# ---- the records ---------------------------------------------------------------------------------------


def _span(steps: list[int]) -> str:
    s = sorted(set(steps))
    if not s:
        return "none"
    return f"{s[0]}..{s[-1]}" if s == list(range(s[0], s[-1] + 1)) and len(s) > 1 else ", ".join(map(str, s))


def reconcile_records(
    run: Path, step: int, log: Log, redraw: Callable[[list[dict]], None] | None = None
) -> list[dict]:
    """Keep the records of steps <= `step` in metrics.jsonl; the rest are appended to metrics.jsonl.dropped.
    `redraw(kept)` rewrites steps.md and the plots. Returns the dropped records."""
    path = Path(run) / "metrics.jsonl"
    rows = learning.read_jsonl(path) if path.exists() else []
    kept = [r for r in rows if int(r.get("step", 0)) <= step]
    dropped = [r for r in rows if int(r.get("step", 0)) > step]
    train_kept = [r["step"] for r in kept if r.get("kind") == "train"]
    if not dropped:
        if train_kept:
            log(f"records: metrics.jsonl has steps {_span(train_kept)}, as the checkpoint of step {step}")
        return []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    with open(path.with_name(path.name + ".dropped"), "a") as f:
        for r in dropped:
            f.write(json.dumps({**r, "dropped": stamp, "resumed_from": step}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    atomic.write_bytes(path, "".join(json.dumps(r) + "\n" for r in kept).encode())
    if redraw is not None:
        redraw(kept)
    train_dropped = [r["step"] for r in dropped if r.get("kind") == "train"]
    log(
        f"records: kept steps {_span(train_kept)}; dropped steps {_span(train_dropped or [r['step'] for r in dropped])}"
        f" (after the checkpoint of step {step}; kept in {path.name}.dropped); steps.md and the plots redrawn"
    )
    return dropped


def prepare(
    run: Path,
    *,
    fresh: bool,
    resume_from: int | None,
    recipe: str,
    stack: str,
    overrides: list[str],
    log: Log,
    redraw: Callable[[list[dict]], None] | None = None,
) -> int:
    """Everything above, in order; returns the step verl resumes from (0: a fresh start)."""
    ckpt = Path(run) / "checkpoints"

    def cmd(args: list[str]) -> str:
        return train_command(recipe, stack, [*args, *overrides])

    step = choose(ckpt, fresh, resume_from, cmd, log)
    set_aside(ckpt, step, log)
    reconcile_records(run, step, log, redraw)
    prompt_record.reconcile(run, step, log)  # prompts.jsonl likewise
    return step
