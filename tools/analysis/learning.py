"""The learning curve of a run: reward and held-out accuracy over the steps, against the base model.

Used by `make train` (learning.png in the run folder, the final evaluation), `make report` (the plot and
table in report.html), bench/bench_learn.py and tests/test_learn.py (the figures: how far validation
accuracy rose above the base model's).

Inputs: make train's metrics.jsonl records ({"step", "kind": "train"|"validation", "metrics"}) or verl's
file-logger records ({"step", "data"}); the validation accuracy is verl's `val-core/<data source>/acc/
mean@<n>` (the mean over n samples per problem of the reward's `acc`); the base model's figures come from
base_model.json (tools/miniature: addition_model.py, trace_model.py), copied into the run folder by make
train, and final_eval.json (tools/miniature/final_eval.py). It reads runs; it makes and exports no model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tools import atomic, records
from tools.analysis import reasoning
from tools.report import runs

REWARD_KEY = "critic/rewards/mean"
BASE_FILE = "base_model.json"
FINAL_FILE = "final_eval.json"
Log = Callable[[str], None]


def accuracy_key(keys: Iterable[str], wanted: str | None = None) -> str | None:
    """The validation accuracy metric: `wanted` when present, else the first val-core/*/acc/mean@n."""
    keys = list(keys)
    if wanted and wanted in keys:
        return wanted
    return next((k for k in sorted(keys) if records.is_accuracy(k)), None)


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
        per bucket, tools/analysis/reasoning.py reads those)."""
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


read_jsonl = records.read_jsonl  # metrics.jsonl, a torn last line skipped (tools/records.py)
_json = records.read_json


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


def conclude(run: Path, cfg: Any, key: str | None, out: TextIO) -> None:
    """The end of a recipe that learns (launch.learning), after the final evaluation
    (tools/miniature/final_eval.py): the learning curve in one line, learning.png redrawn with the final
    figures; for tiny-zero also what the run shows of R1-Zero's mechanism (tools/analysis/reasoning.py)."""
    from omegaconf import OmegaConf

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
