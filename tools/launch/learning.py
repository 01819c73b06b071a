"""The learning curve of a run: reward and held-out accuracy over the steps, against the base model.

Used by `make train` (learning.png in the run folder, the final evaluation), `make report` (the plot and
table in report.html), bench/bench_learn.py and tests/test_learn.py (the figures: how far validation
accuracy rose above the base model's).

Inputs: make train's metrics.jsonl records ({"step", "kind": "train"|"validation", "metrics"}) or verl's
file-logger records ({"step", "data"}); the validation accuracy is verl's `val-core/<data source>/acc/
mean@<n>` (the mean over n samples per problem of the reward's `acc`); the base model's figures come from
base_model.json (tools/launch/base_model.py), copied into the run folder by make train.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tools import atomic
from tools.errors import UserError
from tools.launch import base_model as B
from tools.launch import reasoning
from tools.launch import trace_model as TM
from tools.launch.assets import layer_spec, long_addition_split
from tools.launch.report import runs

ACC_KEY = re.compile(r"^val-core/(.+)/acc/mean@(\d+)$")
REWARD_KEY = "critic/rewards/mean"
BASE_FILE = "base_model.json"
FINAL_FILE = "final_eval.json"
Log = Callable[[str], None]


def accuracy_key(keys: Iterable[str], wanted: str | None = None) -> str | None:
    """The validation accuracy metric: `wanted` when present, else the first val-core/*/acc/mean@n."""
    keys = list(keys)
    if wanted and wanted in keys:
        return wanted
    return next((k for k in sorted(keys) if ACC_KEY.match(k)), None)


@dataclass
class Curve:
    reward: dict[int, float] = field(default_factory=dict)  # training step -> reward mean
    accuracy: dict[int, float] = field(default_factory=dict)  # validation step -> accuracy
    key: str | None = None
    base: dict[str, Any] | None = None  # base_model.json
    final: dict[str, Any] | None = None  # final_eval.json

    @property
    def base_sampled(self) -> float | None:
        """The base model's sampled accuracy: one figure for tiny-learn's base model (tiny-zero's records
        per bucket, tools/launch/reasoning.py reads those)."""
        value = ((self.base or {}).get("held_out") or {}).get("sampled_acc")
        return value if isinstance(value, int | float) else None

    def rise(self) -> float | None:
        """The last validation's accuracy minus the base model's sampled accuracy (its own figure when
        there is one, else the validation before training). The last, not the best: the maximum over noisy
        validations is biased upward, and a run that rose and fell back did not learn what its peak says."""
        if not self.accuracy:
            return None
        start = self.base_sampled if self.base_sampled is not None else self.accuracy.get(0)
        return None if start is None else self.accuracy[max(self.accuracy)] - start

    def summary(self) -> dict[str, Any]:
        acc = self.accuracy
        steps = sorted(self.reward)
        first = [self.reward[s] for s in steps[:5]]
        last = [self.reward[s] for s in steps[-5:]]
        return {
            "accuracy_key": self.key,
            "base_sampled_acc": self.base_sampled,
            "base_greedy_acc": ((self.base or {}).get("held_out") or {}).get("greedy_acc"),
            "validation": {str(k): v for k, v in sorted(acc.items())},
            "validation_first": acc[min(acc)] if acc else None,
            "validation_last": acc[max(acc)] if acc else None,
            "validation_best": max(acc.values()) if acc else None,
            "rise_over_base": self.rise(),
            "reward_first5": sum(first) / len(first) if first else None,
            "reward_last5": sum(last) / len(last) if last else None,
            "final_greedy_acc": (self.final or {}).get("greedy_acc"),
            "final_sampled_acc": (self.final or {}).get("sampled_acc"),
        }


def curve(records: Iterable[Mapping[str, Any]], wanted_key: str | None = None) -> Curve:
    """A Curve from metrics.jsonl or verl file-logger records (later records win a step)."""
    c = Curve()
    for r in records:
        m = r.get("metrics", r.get("data")) or {}
        step = int(r["step"])
        if r.get("kind", "train") == "train" and REWARD_KEY in m and "timing_s/step" in m:
            c.reward[step] = float(m[REWARD_KEY])
        key = accuracy_key(m, wanted_key)
        if key and r.get("kind", "validation") == "validation":
            c.key = key
            c.accuracy[step] = float(m[key])
    return c


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def run_curve(run: Path, wanted_key: str | None = None) -> Curve:
    """The curve of a run folder (metrics.jsonl, base_model.json, final_eval.json)."""
    run = Path(run)
    c = curve(read_jsonl(run / "metrics.jsonl"), wanted_key) if (run / "metrics.jsonl").is_file() else Curve()
    c.base, c.final = _json(run / BASE_FILE), _json(run / FINAL_FILE)
    return c


def figure(c: Curve, title: str) -> Any:
    """The learning-curve figure: reward mean (training steps) and validation accuracy over the steps,
    the base model's sampled accuracy as the horizontal starting line (and the trained actor's greedy
    accuracy when there is a final evaluation). None when there is nothing to draw."""
    if not c.reward and not c.accuracy:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # not pyplot: no global figure state, and its import is skipped
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7.2, 4.0))
    ax = fig.subplots()
    if c.reward:
        xs = sorted(c.reward)
        ax.plot(
            xs, [c.reward[x] for x in xs], marker=".", color="#999999", label="reward mean (training batch)"
        )
    if c.accuracy:
        xs = sorted(c.accuracy)
        label = "validation accuracy" + (f" ({c.key.split('/')[-1]})" if c.key else "")
        ax.plot(xs, [c.accuracy[x] for x in xs], marker="o", color="#1f77b4", linewidth=2, label=label)
    if c.base_sampled is not None:
        ax.axhline(
            c.base_sampled,
            color="#d62728",
            linestyle="--",
            label=f"base model, sampled ({c.base_sampled:.2f})",
        )
    if c.final and isinstance(c.final.get("greedy_acc"), int | float):
        ax.axhline(c.final["greedy_acc"], color="#2ca02c", linestyle=":",
                   label=f"trained model, greedy ({c.final['greedy_acc']:.2f})")  # fmt: skip
    ax.set_ylim(0, 1.02)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("accuracy / reward")
    ax.set_title(f"{title}: learning curve")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.subplots_adjust(left=0.09, right=0.98, top=0.92, bottom=0.12)  # tight_layout would draw it twice
    return fig


def plot(c: Curve, title: str) -> bytes | None:
    """learning.png (see `figure`) as PNG bytes; None when there is nothing to draw."""
    fig = figure(c, title)
    if fig is None:
        return None
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def describe(c: Curve) -> str:
    """One line: base -> validation accuracies -> rise."""
    s = c.summary()
    parts = []
    if s["base_sampled_acc"] is not None:
        parts.append(f"base model sampled {s['base_sampled_acc']:.3f}")
    if c.accuracy:
        parts.append("validation " + " ".join(f"{k}:{v:.2f}" for k, v in sorted(c.accuracy.items())))
    if s["rise_over_base"] is not None:
        parts.append(f"rise {s['rise_over_base']:+.3f}")
    if isinstance(s["final_greedy_acc"], int | float):
        g0 = s["base_greedy_acc"]
        parts.append(
            f"greedy {'' if g0 is None else f'{g0:.3f} -> '}{s['final_greedy_acc']:.3f}, "
            f"sampled {s['final_sampled_acc']:.3f} (trained actor exported and scored in transformers)"
        )
    return "; ".join(parts)


# ---- the trained actor, scored like the base model ------------------------------------------------


def actor_model_checkpoint(actor: Path) -> Path:
    """The Megatron torch_dist checkpoint of the actor's weights in a verl checkpoint's actor folder:
    `actor/dist_ckpt` (verl 0.6.0) or the model entry of `actor/ckpt_contents.json` (verl 0.9.1 keeps the
    model, optimizer and extra state apart: `actor/model/dist_ckpt`)."""
    contents = _json(actor / "ckpt_contents.json")
    rel = ((contents or {}).get("contents") or {}).get("model", {}).get("path")
    for ckpt in [actor / rel] if rel else [actor / "dist_ckpt", actor / "model" / "dist_ckpt"]:
        if (ckpt / "metadata.json").is_file():
            return ckpt
    raise UserError(
        f"{actor}: no actor model checkpoint to evaluate (dist_ckpt/ or model/dist_ckpt/ with metadata.json)",
        fix="the recipe must save at its last step (verl.trainer.save_freq)",
    )


def final_eval(run: Path, cfg: Any, step: int, log: Log = print) -> dict[str, Any]:
    """Export the actor of checkpoint `step` to HF (the project's mcore-to-hf) and score it on the held-out
    problems exactly as the base model was scored (greedy and sampled); writes run/final_eval.json."""
    from omegaconf import OmegaConf

    hf_model = Path(cfg.launch.paths.hf_model)
    ckpt = actor_model_checkpoint(run / "checkpoints" / f"global_step_{step}" / "actor")
    base_settings = OmegaConf.to_container(cfg.launch.base_model, resolve=True)
    long_addition = OmegaConf.select(cfg, "launch.task.kind") == "long-addition"
    settings = (TM if long_addition else B).Settings.from_mapping(base_settings)
    with tempfile.TemporaryDirectory(prefix="final-eval-", dir=run) as tmp:
        out = Path(tmp) / "hf"
        cmd = [sys.executable, "-m", "tools.weights", "mcore-to-hf", str(ckpt), str(out), "--config", str(hf_model),
               "--layer-spec", layer_spec(), "--threads", "1"]  # fmt: skip
        r = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True)
        if r.returncode != 0:
            raise UserError(
                f"mcore-to-hf of {ckpt} failed:\n{r.stderr[-2000:]}", fix="run the command by hand"
            )
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (hf_model / name).is_file() and not (out / name).exists():
                shutil.copyfile(hf_model / name, out / name)
        import torch
        from transformers import AutoTokenizer, DeepseekV3ForCausalLM

        if settings.threads:
            torch.set_num_threads(settings.threads)
        tok = AutoTokenizer.from_pretrained(hf_model)
        model = DeepseekV3ForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
        if long_addition:  # the held-out problems, scored as trace_model scored the base model
            test = long_addition_split(OmegaConf.to_container(cfg.launch.task, resolve=True))[1]
            result = {"step": step, **TM.evaluate(model, tok, test, settings, seed=settings.seed + 1)}
        else:
            test = B.Problems.read(Path(cfg.launch.paths.data) / "test.parquet")
            result = {"step": step, **B.evaluate(model, tok, test, settings, seed=settings.seed + 1)}
    atomic.write_json(run / FINAL_FILE, result)
    return result


def conclude(run: Path, cfg: Any, saved: int, key: str | None, out: TextIO) -> None:
    """The end of a recipe that learns (launch.learning): the trained actor scored as the base model was
    (when launch.final_eval), the learning curve in one line, learning.png redrawn with the final figures;
    for tiny-zero also what the run shows of R1-Zero's mechanism (tools/launch/reasoning.py)."""
    from omegaconf import OmegaConf

    if cfg.launch.get("final_eval") and saved:
        t = time.time()
        out.write(
            f"final evaluation: exporting the actor of step {saved} and scoring it on the held-out problems ...\n"
        )
        out.flush()
        final_eval(run, cfg, saved, log=lambda m: (out.write(m + "\n"), out.flush()))
        out.write(f"  ({time.time() - t:.0f} s)\n")
    c = run_curve(run, key)
    png = plot(c, run.name)
    if png:
        atomic.write_bytes(run / "learning.png", png)
    atomic.write_json(run / "learning.json", c.summary())
    out.write(f"learning: {describe(c)}\nlearning curve: {run / 'learning.png'}, {run / 'learning.json'}\n")
    if OmegaConf.select(cfg, "launch.task.kind") == "long-addition":
        pic = reasoning.picture(runs.read(run))
        if pic is not None:
            atomic.write_bytes(run / "reasoning.png", reasoning.draw([pic]))
            atomic.write_json(run / "reasoning.json", reasoning.figures(pic))
            out.write("".join(line + "\n" for line in reasoning.describe(pic, reasoning.kind_of(cfg))))
            out.write(f"reasoning: {run / 'reasoning.png'}, {run / 'reasoning.json'}\n")
