"""`make eval`: sample a checkpoint K times a problem with DeepSeek-R1's protocol, grade with the training
reward, write the eval folder (folder.py) and its summary (summary.py). docs/evaluation.md, "make eval".

    python -m tools.eval --run outputs/current/tiny-learn --step 30 --bench test --k 16
    python -m tools.eval --run outputs/current/tiny-zero --base --bench test      # the model before RL
    python -m tools.eval --model <hf folder> --bench aime24,math500 --out <folder>
    python -m tools.eval --run ... --shard 2/8          # node 2 of 8 (shards.py); --shard auto under srun
    python -m tools.eval --run ... --summarize          # the summary of the shards' responses, no sampling
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools.errors import UserError, run_cli
from tools.eval import problems as P
from tools.eval.engine import Engine, Sampling, model_context, warn
from tools.eval.folder import EvalFolder
from tools.eval.grading import Grader
from tools.eval.shards import Shard, missing_error, parse_shard, shard_counts
from tools.eval.summary import summarize_by_source
from tools.miniature.assets import layer_spec
from tools.miniature.final_eval import actor_model_checkpoint

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="make eval", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--run", type=Path, help="a run folder (outputs/<stack>/<run>): its checkpoints and config"
    )
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the latest); 0: the base model")
    p.add_argument("--base", action="store_true", help="the run's base model, before RL (= --step 0)")
    p.add_argument("--model", type=Path, help="a Hugging Face model folder instead of a run's checkpoint")
    p.add_argument(
        "--bench", default="test", help="comma-separated: test (the run's held-out set), aime24, ..."
    )
    p.add_argument("--k", type=int, default=16, help="responses a problem (default 16)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument(
        "--max-new-tokens", type=int, default=32768, help="capped by the model's context, with a warning"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--batch", type=int, default=32, help="problems an engine call (and a write of the folder)"
    )
    p.add_argument("--limit", type=int, help="the first N problems of each benchmark only (a quick look)")
    p.add_argument("--reward", help="the grader (tools/reward/verl_reward.py); default: the run's reward")
    p.add_argument("--cpu-kernels", default="portable", choices=("portable", "native"))
    p.add_argument("--out", type=Path, help="the eval folder's parent (default <run>/eval/step_<n>)")
    p.add_argument(
        "--shard", help="i/n: sample only the problems whose index mod n is i (node i of n); auto: from "
        "SLURM_NODEID/SLURM_NNODES or RANK/WORLD_SIZE",
    )  # fmt: skip
    p.add_argument(
        "--summarize", action="store_true", help="sample nothing: the summary of the folder's responses"
    )
    return p.parse_args(argv)


def load_config(run: Path) -> Any:
    from omegaconf import OmegaConf

    path = run / "config.yaml"
    if not path.is_file():
        raise UserError(f"{run}: not a run folder (no config.yaml)", fix="RUN= a folder `make train` wrote")
    return OmegaConf.load(path)


def checkpoint_steps(run: Path) -> list[int]:
    return sorted(
        int(d.name.removeprefix("global_step_"))
        for d in (run / "checkpoints").glob("global_step_*")
        if d.name.removeprefix("global_step_").isdigit()
    )


def export(run: Path, step: int, config: Any, log=print, shard: Shard | None = None) -> Path:
    """The actor of checkpoint `step` as a Hugging Face folder (<run>/eval/step_<n>/hf), by the project's
    mcore-to-hf as the final evaluation exports it; made once, then reused."""
    out = run / "eval" / f"step_{step}" / "hf"
    if (out / "config.json").is_file():
        return out
    ckpt = actor_model_checkpoint(run / "checkpoints" / f"global_step_{step}" / "actor")
    hf_model = Path(config.launch.paths.hf_model)
    tmp = out.with_name("hf.partial" if shard is None else f"hf.partial-shard-{shard.index}")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"exporting the actor of step {step} to {out} (mcore-to-hf) ...")
    cmd = [sys.executable, "-m", "tools.weights", "mcore-to-hf", str(ckpt), str(tmp), "--config", str(hf_model),
           "--layer-spec", layer_spec(), "--threads", "1"]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(
            f"mcore-to-hf of {ckpt} failed:\n{r.stderr[-2000:]}",
            fix="run the command by hand: " + " ".join(cmd),
        )
    for name in TOKENIZER_FILES:
        if (hf_model / name).is_file() and not (tmp / name).exists():
            shutil.copyfile(hf_model / name, tmp / name)
    try:
        tmp.rename(out)
    except OSError:  # another shard's node exported it at the same time
        if not (out / "config.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def same_base(run: Path, hf_model: Path) -> None:
    """Refuse a checkpoint whose base model (and so tokenizer) was re-made after the run: the run keeps the
    base model's record (base_model.json) as it trained; the exported actor takes the tokenizer of today's."""
    import json

    then, now = run / "base_model.json", hf_model / "base_model.json"
    if then.is_file() and now.is_file() and json.loads(then.read_text()) != json.loads(now.read_text()):
        raise UserError(
            f"{hf_model}: the base model was re-made since {run} trained ({now} differs from {then}); its "
            "tokenizer need not be the one the checkpoint learned with",
            fix="evaluate the run's own checkpoints only with the base it started from (train it again), "
            "or MODEL=<an exported folder with its own tokenizer>",
        )


def resolve_model(a: argparse.Namespace, shard: Shard | None = None) -> tuple[Path, Any, str, Path]:
    """(HF model folder, the run's config or None, the model's label, the eval folders' parent)."""
    if a.model is not None:
        if a.run is not None and (a.step is not None or a.base):
            raise UserError("give MODEL= or RUN= with STEP=, not both", fix="MODEL= alone, or RUN= STEP=")
        if not (a.model / "config.json").is_file():
            raise UserError(
                f"{a.model}: not a Hugging Face model folder (no config.json)", fix="MODEL=<hf folder>"
            )
        config = load_config(a.run) if a.run is not None else None
        return a.model, config, str(a.model), a.out or REPO / "outputs" / "eval" / a.model.resolve().name
    if a.run is None:
        raise UserError(
            "nothing to evaluate", fix="make eval RUN=<run folder> [STEP=<n>|BASE=1], or MODEL=<hf folder>"
        )
    config = load_config(a.run)
    step = 0 if a.base else a.step
    steps = checkpoint_steps(a.run)
    if step is None:
        if not steps:
            raise UserError(f"{a.run}: no checkpoints", fix="STEP=0 (or BASE=1) for the base model")
        step = steps[-1]
    if step == 0:
        model = Path(config.launch.paths.hf_model)
        if not (model / "config.json").is_file():
            raise UserError(
                f"{model}: the run's base model is not there",
                fix=f"make it: {config.launch.paths.get('made_by')}",
            )
    elif step not in steps:
        raise UserError(
            f"{a.run}: no checkpoint of step {step} (checkpoints/global_step_{step})",
            fix=f"STEP= one of {', '.join(map(str, steps)) or '(none)'}, or 0 for the base model",
        )
    else:
        same_base(a.run, Path(config.launch.paths.hf_model))
        model = export(a.run, step, config, shard=shard)
    return model, config, f"{a.run} step {step}", a.out or a.run / "eval" / f"step_{step}"


def describe(o: dict[str, Any], k: int) -> str:
    err = "" if o["pass@1_stderr"] is None else f" ± {o['pass@1_stderr']:.3f}"
    return (
        f"{o['problems']} problems x {k}: pass@1 {o['pass@1']:.3f}{err}, cons@{k} {o.get(f'cons@{k}', float('nan')):.3f}, "
        f"pass@{k} {o['pass@k'].get(str(k), float('nan')):.3f}, truncated {o['truncation_rate']:.1%}"
    )


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    a = parse(argv)
    if a.k < 1:
        raise UserError(
            f"K={a.k}: at least one response a problem is needed", fix="K=16 (the paper's AIME protocol)"
        )
    if a.batch < 1 or (a.limit is not None and a.limit < 1):
        raise UserError("--batch and --limit must be at least 1")
    benches = [b.strip() for b in a.bench.split(",") if b.strip()]
    P.check_names(benches)
    shard = parse_shard(a.shard) if a.shard is not None else None
    if shard is not None and a.summarize:
        raise UserError(
            "--shard and --summarize together", fix="SUMMARY=1 without SHARD= (it samples nothing)"
        )
    model, config, label, parent = resolve_model(a, shard)
    sets = [P.load(b, config) for b in benches]  # every benchmark checked before any sampling
    grader = Grader(a.reward) if a.reward else Grader.from_config(config)
    engine: Engine | None = None
    context = model_context(model)
    for pset in sets:
        problems = pset.problems[: a.limit] if a.limit else pset.problems
        folder_settings = {
            "model": label, "benchmark": pset.name, "file": str(pset.file), "sha256": pset.sha256,
            "problems": len(problems), "k": a.k, "temperature": a.temperature, "top_p": a.top_p,
            "max_new_tokens": a.max_new_tokens, "seed": a.seed, "grader": grader.name,
        }  # fmt: skip
        folder = EvalFolder(parent / pset.name, folder_settings, shard)
        done = folder.done()
        todo = [
            (i, p) for i, p in enumerate(problems) if p.id not in done and (shard is None or shard.owns(i))
        ]
        if a.summarize:
            todo = []
        t = time.time()
        if todo:
            if engine is None:
                engine = Engine(
                    model,
                    max_model_len=context or (a.max_new_tokens + 1024),
                    seed=a.seed,
                    cpu_kernels=a.cpu_kernels,
                )
            ids = {i: engine.prompt_ids(p.messages) for i, p in todo}
            longest = max(len(x) for x in ids.values())
            new_tokens = a.max_new_tokens
            if context is not None and longest + new_tokens > context:
                new_tokens = context - longest
                warn(
                    f"max {a.max_new_tokens} new tokens capped to {new_tokens}: the model's context is {context}"
                )
            s = Sampling(a.k, a.temperature, a.top_p, new_tokens, a.seed)
            bar = tqdm(total=len(todo), desc=f"{pset.name}: problems", unit="problem", initial=0)
            for start in range(0, len(todo), a.batch):
                chunk = todo[start : start + a.batch]
                outs = engine.sample(
                    [ids[i] for i, _ in chunk], s, [a.seed * 1_000_003 + i for i, _ in chunk]
                )
                records = []
                for (_, p), completions in zip(chunk, outs, strict=True):
                    for j, c in enumerate(completions):
                        correct, pred = grader.grade(p.source, c.text, p.ground_truth)
                        records.append({"id": p.id, "source": p.source, "sample": j, "text": c.text, "pred": pred,
                                        "correct": correct, "length": c.length, "truncated": c.truncated})  # fmt: skip
                folder.add(records)
                bar.update(len(chunk))
            bar.close()
        records, missing = folder.merged([p.id for p in problems])
        if missing:
            error = missing_error(folder.path, missing, len(problems), shard_counts(folder.path))
            if a.summarize or shard is None:
                raise error
            print(f"{pset.name}: shard {shard} done; the summary waits for the others:\n  {error}")
            continue
        summary = summarize_by_source(records)
        summary["seconds"] = round(time.time() - t, 1)
        path = folder.write_summary(summary)
        print(f"{pset.name}: {describe(summary['overall'], a.k)} -> {path}")
    return 0


if __name__ == "__main__":
    run_cli(main)
