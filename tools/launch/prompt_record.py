"""The run's prompt record, `<run>/prompts.jsonl`: one row per trained step, the prompts that step trained on.

    {"step": 3, "prompts": [17, 4, 30, 11], "responses": [2, 2, 2, 2]}
    {"step": 3, "prompts": [...], "responses": [...], "fetched_for": [2, 3, 3, 3]}     (the async modes)

`prompts` are the dataset's row ids (each row's `extra_info.index`, which verl's dataset hands on as `index`,
verl/utils/dataset/rl_dataset.py), once per prompt; `responses` how many of its responses the step scored
(rollout.n unless a group was cut). Where they come from (tools/reward/tally.py, no change to verl):
- sync: the reward function sees each training response's extra_info; a step's scoring ends before the next
  step's starts, so block k of batch x n training responses is step k of the attempt (the reward tally's own
  rule). The scoring order is the order responses finished, not the batch's, so a sync row lists the step's
  prompts in ascending order.
- colocate_async, separate_async: the trainer's sampler (tools/verl_plugins/tallied_sampler.py) writes, when
  verl's replay buffer has chosen a step's trajectories, their prompts in the batch's order and the step each
  was taken from the dataloader for (`fetched_for`: a step earlier for the warm-up batch verl generates
  ahead).

Only steps the launcher counts as trained (logged by verl, or saved and never logged) get a row, so the file
agrees with metrics.jsonl; a resume keeps the rows up to its checkpoint and moves the later ones to
`prompts.jsonl.dropped` (as tools/launch/resume.py does for metrics.jsonl), so the file always reads as one
run. `python -m tools.launch.prompt_record check <run>` compares it with the sequence verl's own sampler gives
for the run's config and seed (`expected`), which an uninterrupted sync run trains on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tools import atomic
from tools.errors import UserError
from tools.records import read_jsonl
from tools.reward import tally

FILE = "prompts.jsonl"
Log = Callable[[str], None]


def _row(
    step: int, prompts: Sequence[Any], fetched_for: Sequence[Any] | None, ordered: bool
) -> dict[str, Any]:
    """A step's row from its responses' prompts (one entry a response); `ordered`: keep the batch's order."""
    counts: dict[Any, int] = {}
    first: dict[Any, Any] = {}
    for i, p in enumerate(prompts):
        counts[p] = counts.get(p, 0) + 1
        if fetched_for is not None and p not in first:
            first[p] = fetched_for[i]
    keys = list(counts) if ordered else sorted(counts)
    row: dict[str, Any] = {"step": step, "prompts": keys, "responses": [counts[k] for k in keys]}
    if fetched_for is not None:
        row["fetched_for"] = [first[k] for k in keys]
    return row


def from_tally(
    lines: Iterable[Mapping[str, Any]], per_step_n: int, first_step: int
) -> dict[int, dict[str, Any]]:
    """step -> row from an attempt's reward tally lines (tools/reward/tally.py): the sampler's lines that name
    their step where there are any (the async modes), else blocks of `per_step_n` training responses from
    `first_step` on (sync). A step whose responses lack a prompt id is left out."""
    train = [r for r in lines if r.get("split") == "train"]
    keyed = [r for r in train if isinstance(r.get("step"), int | float)]
    out: dict[int, dict[str, Any]] = {}
    if keyed:
        per: dict[int, list[Mapping[str, Any]]] = {}
        for rec in keyed:
            per.setdefault(int(rec["step"]), []).append(rec)
        for step, recs in sorted(per.items()):
            prompts = [p for r in recs for p in (r.get("prompts") or [None] * int(r["n"]))]
            fetched = [f for r in recs for f in (r.get("fetched_for") or [None] * int(r["n"]))]
            if prompts and None not in prompts:
                out[step] = _row(step, prompts, fetched, ordered=True)
        return out
    if per_step_n <= 0:
        return {}
    block: list[Any] = []
    step = first_step
    for rec in train:
        block.extend(rec.get("prompts") or [None] * int(rec["n"]))
        if len(block) >= per_step_n:
            if None not in block:
                out[step] = _row(step, block, None, ordered=False)
            block, step = [], step + 1
    return out


def read(run: Path) -> list[dict[str, Any]]:
    """The rows of `<run>/prompts.jsonl` (none when there is no file)."""
    path = Path(run) / FILE
    return read_jsonl(path, keep=lambda r: isinstance(r, dict) and "step" in r) if path.is_file() else []


def _write(run: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    ordered = sorted(rows, key=lambda r: int(r["step"]))
    atomic.write_bytes(Path(run) / FILE, "".join(json.dumps(r) + "\n" for r in ordered).encode())


def add_attempt(
    run: Path, attempt: int, per_step_n: int, first_step: int, trained: Iterable[int]
) -> list[int]:
    """Add the rows of attempt `attempt`'s trained steps (`trained`) to `<run>/prompts.jsonl`, from its reward
    tally; `first_step`: the attempt's first step (sync's blocks count from it). Returns the steps added."""
    path = tally.path_for(Path(run) / f"verl-metrics-{attempt}.jsonl")
    if path is None or not path.is_file():
        return []
    wanted = set(trained)
    new = {s: r for s, r in from_tally(tally.read(path), per_step_n, first_step).items() if s in wanted}
    if not new:
        return []
    rows = {int(r["step"]): r for r in read(run)}
    rows.update(new)
    _write(run, rows.values())
    return sorted(new)


def reconcile(run: Path, step: int, log: Log) -> list[dict[str, Any]]:
    """Keep the rows of steps <= `step` (the checkpoint resumed from); the later ones are appended to
    prompts.jsonl.dropped. Returns the dropped rows."""
    rows = read(run)
    dropped = [r for r in rows if int(r["step"]) > step]
    if not dropped:
        return []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    with open(Path(run) / f"{FILE}.dropped", "a") as f:
        for r in dropped:
            f.write(json.dumps({**r, "dropped": stamp, "resumed_from": step}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    _write(run, [r for r in rows if int(r["step"]) <= step])
    log(f"records: {FILE}: dropped the prompts of steps {', '.join(str(r['step']) for r in dropped)}"
        f" (after the checkpoint of step {step}; kept in {FILE}.dropped)")  # fmt: skip
    return dropped


def compare(rows: Sequence[Mapping[str, Any]], expected: Mapping[int, Sequence[int]], n: int) -> list[str]:
    """What differs between a run's rows and the prompts each step should train on (`expected`: step ->
    prompt ids, a step's order not compared), each response count against rollout.n `n`: [] when they agree."""
    problems = []
    got = {int(r["step"]): r for r in rows}
    for step in sorted(set(got) | set(expected)):
        if step not in got:
            problems.append(f"step {step}: no row (its prompts were not recorded)")
            continue
        if step not in expected:
            problems.append(f"step {step}: recorded, but not a step of the run to compare with")
            continue
        have, want = list(got[step]["prompts"]), list(expected[step])
        if sorted(have) != sorted(want):
            skipped = sorted(set(want) - set(have))
            extra = sorted(set(have) - set(want))
            problems.append(f"step {step}: prompts {sorted(have)}, expected {sorted(want)}"
                            f" (skipped {skipped}, not expected {extra})")  # fmt: skip
        bad = [(p, c) for p, c in zip(have, got[step].get("responses", []), strict=False) if c != n]
        if bad:
            problems.append(f"step {step}: responses per prompt {bad}, expected {n} each")
    seen: dict[int, int] = {}
    for step in sorted(got):
        for p in got[step]["prompts"]:
            if p in seen and not _next_epoch(expected, seen[p], step, p):
                problems.append(f"prompt {p}: trained at step {seen[p]} and again at step {step}")
            seen[p] = step
    return problems


def _next_epoch(expected: Mapping[int, Sequence[int]], first: int, again: int, prompt: int) -> bool:
    """Whether the uninterrupted sequence also trains `prompt` at both steps (a new epoch)."""
    return prompt in expected.get(first, ()) and prompt in expected.get(again, ())


def expected(cfg: Any, steps: int) -> dict[int, list[int]]:
    """step -> the prompt ids (dataset extra_info index) verl's own sampler gives steps 1..`steps` of a sync run
    of `cfg` (a composed run config, `verl.` keys): verl's dataset and create_rl_sampler with the recipe's data
    seed, through a StatefulDataLoader of train_batch_size, started again at each epoch's end as verl's trainer
    does (verl/trainer/ppo/v1/trainer_base.py `_fetch_one_gen_batch`)."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import collate_fn

    data = cfg.verl.data
    tokenizer = hf_tokenizer(OmegaConf.select(cfg, "verl.actor_rollout_ref.model.path"))
    dataset = create_rl_dataset(data.train_files, data, tokenizer, None, is_train=True,
                                max_samples=data.get("train_max_samples", -1))  # fmt: skip
    loader = StatefulDataLoader(dataset=dataset, batch_size=int(data.train_batch_size), num_workers=0,
                                drop_last=True, collate_fn=collate_fn,
                                sampler=create_rl_sampler(data, dataset))  # fmt: skip
    out: dict[int, list[int]] = {}
    it = iter(loader)
    for step in range(1, steps + 1):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        out[step] = [int(i) for i in batch["index"]]
    return out


def check(run: Path, out: Any = sys.stdout) -> int:
    """`check <run>`: the run's prompts.jsonl against verl's sampler for its config.yaml (sync runs)."""
    from omegaconf import OmegaConf

    run = Path(run)
    rows = read(run)
    if not rows:
        raise UserError(
            f"{run / FILE}: no prompt record", fix="train the run first: make train (it writes it)"
        )
    cfg = OmegaConf.load(run / "config.yaml")
    mode = OmegaConf.select(cfg, "verl.trainer.v1.trainer_mode", default="sync")
    if mode != "sync":
        raise UserError(f"{run}: a {mode} run: which step trains a prompt depends on when its generation "
                        "finished, so no fixed sequence to check against",
                        fix="compare its prompts.jsonl with an uninterrupted run's (docs/faults.md)")  # fmt: skip
    n = int(OmegaConf.select(cfg, "verl.actor_rollout_ref.rollout.n", default=1))
    problems = compare(rows, expected(cfg, max(int(r["step"]) for r in rows)), n)
    for line in problems:
        out.write(f"  {line}\n")
    steps = [int(r["step"]) for r in rows]
    seed = OmegaConf.select(cfg, "verl.data.seed", default=None)
    verdict = "not identical" if problems else "identical"
    out.write(f"{run / FILE}: steps {min(steps)}..{max(steps)}: the prompts are {verdict} to those of verl's sampler"
              f" (data seed {seed})\n")  # fmt: skip
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.launch.prompt_record", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="compare <run>/prompts.jsonl with verl's sampler").add_argument("run")
    a = ap.parse_args(argv)
    return check(Path(a.run))


if __name__ == "__main__":
    from tools.errors import run_cli

    run_cli(main)
