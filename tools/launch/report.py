"""Run reports: `make report RUN=<run folder or metrics file>`, for a live or a finished run.

Input (what verl 0.6.0 writes with `trainer.logger=[console,file]`): verl's `file` logger backend
(verl/utils/tracking.py FileLogger) appends one JSON object per `Tracking.log` call to
`$VERL_FILE_LOGGER_PATH` (or `$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`):

    {"step": 27, "data": {"timing_s/step": 1338.3, "timing_s/gen": ..., "prompt_length/mean": ..., ...}}

A training step has `timing_s/step`; validation-only records (before training) do not. `make train`'s
merged `metrics.jsonl` ({"step", "kind", "attempt", "metrics"}) is read too. In a run folder the report
takes metrics.jsonl if present, else every verl-metrics-*.jsonl (later attempts win a step), else any
*.jsonl in the file-logger format. A half-written last line (a live run) is skipped.

Output (default <run folder>/report/): steps.md (the published columns), steps.jsonl (one object a step,
the same numbers), reward.png, response_length.png, step_time.png (the step-time split), learning.png
when the run validated (reward and validation accuracy over the steps, the base model's sampled
accuracy as the starting line when the run folder has base_model.json: tools/launch/learning.py) and
report.html, one self-contained page (the PNGs embedded as data: URIs).

Columns, as the published step table of the 671B run:
    prompt / response length   prompt_length/mean, response_length/mean (tokens)
    step                       timing_s/step
    tokens/s per device        total tokens / step time / devices, where total tokens is verl's
                               perf/total_num_tokens (prompt + response tokens of the step; without it:
                               (prompt mean + response mean) x sequences) and devices = ranks /
                               dies_per_device (an A3 NPU package carries 2 dies = 2 ranks: the published
                               "tokens/s per A3"). Equivalently verl's perf/throughput x dies_per_device.
    generation                 timing_s/generate_sequences (the engine's own time; else timing_s/gen)
    reshard                    timing_s/reshard when logged, else timing_s/gen - timing_s/generate_sequences
                               (weight sync and offload/onload around the rollout)
    reward, old log-prob, reference, update   timing_s/reward, /old_log_prob, /ref, /update_actor
    reward mean                critic/rewards/mean (critic/score/mean when absent)
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools import atomic
from tools.errors import UserError


class ReportError(UserError):
    pass


@dataclass(frozen=True)
class Column:
    key: str
    head: str
    fmt: str = "{:.1f}"


COLUMNS = [
    Column("step", "step", "{:d}"),
    Column("prompt_len", "prompt len", "{:.1f}"),
    Column("response_len", "response len", "{:.1f}"),
    Column("step_s", "step (s)", "{:.1f}"),
    Column("tokens_per_s_per_device", "tokens/s per {unit}", "{:.1f}"),
    Column("gen_s", "generate (s)", "{:.1f}"),
    Column("reshard_s", "reshard (s)", "{:.1f}"),
    Column("reward_s", "reward (s)", "{:.1f}"),
    Column("old_log_prob_s", "old log-prob (s)", "{:.1f}"),
    Column("ref_s", "reference (s)", "{:.1f}"),
    Column("update_s", "update (s)", "{:.1f}"),
    Column("reward_mean", "reward mean", "{:.3f}"),
]
SPLIT = [
    ("gen_s", "generate"),
    ("reshard_s", "reshard"),
    ("reward_s", "reward"),
    ("old_log_prob_s", "old log-prob"),
    ("ref_s", "reference"),
    ("update_s", "update"),
    ("other_s", "other"),
]


@dataclass
class Devices:
    ranks: float | None  # world size of the run
    dies_per_device: int = 1
    unit: str = "device"

    @property
    def devices(self) -> float | None:
        return self.ranks / self.dies_per_device if self.ranks else None


def tokens_per_s_per_device(
    total_tokens: float, step_s: float, ranks: float, dies_per_device: int = 1
) -> float:
    """The published table's throughput: all prompt + response tokens of the step / step time / devices."""
    return total_tokens / step_s / (ranks / dies_per_device)


def _get(m: dict[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = m.get(k)
        if isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v)):
            return float(v)
    return None


def generation_and_reshard(m: dict[str, Any]) -> tuple[float | None, float | None]:
    """The generation and reshard seconds of a step, from what the verl release in use logs.

    verl 0.6 (published): generation is the engine's generate_sequences; reshard is the rest of its gen
    phase (the switch to rollout mode and back). verl 0.9 (current, server mode): generation is the gen
    phase (the agent loop against the vLLM servers); reshard is update_weights (the weight sync).
    """
    gen_total = _get(m, "timing_s/gen")
    gen_engine = _get(m, "timing_s/generate_sequences")
    reshard = _get(m, "timing_s/reshard", "timing_s/update_weights")
    if reshard is None and gen_total is not None and gen_engine is not None:
        reshard = max(0.0, gen_total - gen_engine)
    return (gen_engine if gen_engine is not None else gen_total), reshard


def row_from_metrics(step: int, m: dict[str, Any], dev: Devices) -> dict[str, Any]:
    gen_s, reshard = generation_and_reshard(m)
    step_s = _get(m, "timing_s/step", "perf/time_per_step")
    prompt, response = _get(m, "prompt_length/mean"), _get(m, "response_length/mean")
    total = _get(m, "perf/total_num_tokens")
    ranks = dev.ranks
    if ranks is None and total and step_s and _get(m, "perf/throughput"):
        ranks = total / (step_s * _get(m, "perf/throughput"))  # verl: throughput = tokens / (time * n_gpus)
    tps = None
    if total and step_s and ranks:
        tps = tokens_per_s_per_device(total, step_s, ranks, dev.dies_per_device)
    row = {
        "step": int(step),
        "prompt_len": prompt,
        "response_len": response,
        "step_s": step_s,
        "tokens_per_s_per_device": tps,
        "gen_s": gen_s,
        "reshard_s": reshard,
        "reward_s": _get(m, "timing_s/reward"),
        "old_log_prob_s": _get(m, "timing_s/old_log_prob"),
        "ref_s": _get(m, "timing_s/ref"),
        "update_s": _get(m, "timing_s/update_actor"),
        "reward_mean": _get(m, "critic/rewards/mean", "critic/score/mean"),
    }
    if step_s is not None:
        parts = [row[k] or 0.0 for k, _ in SPLIT[:-1]]
        row["other_s"] = max(0.0, step_s - sum(parts))
    return row


# ---- reading ----


def _read_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(step, metrics) from a verl file-logger JSONL or make train's metrics.jsonl; skips a torn last line."""
    out = []
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):  # a live run is writing it
                continue
            raise ReportError(
                f"{path}:{i}: not JSON ({e})", fix="is this a verl metrics JSONL file?"
            ) from None
        if not isinstance(rec, dict) or "step" not in rec:
            raise ReportError(
                f"{path}:{i}: a record without 'step'",
                fix='expected verl\'s file logger lines {"step": N, "data": {...}}',
            )
        data = rec.get("data", rec.get("metrics"))
        if not isinstance(data, dict):
            raise ReportError(f"{path}:{i}: no 'data' (verl file logger) or 'metrics' (make train) object")
        out.append((int(rec["step"]), data))
    return out


def find_metrics(run: Path) -> list[Path]:
    if run.is_file():
        return [run]
    if not run.is_dir():
        raise ReportError(
            f"{run}: no such run folder or metrics file",
            fix="pass RUN=<outputs/<run>> or RUN=<verl metrics .jsonl>",
        )
    if (run / "metrics.jsonl").is_file():
        return [run / "metrics.jsonl"]
    attempts = sorted(
        run.glob("verl-metrics-*.jsonl"),
        key=lambda p: int(p.stem.rsplit("-", 1)[-1]) if p.stem.rsplit("-", 1)[-1].isdigit() else 0,
    )
    if attempts:
        return attempts
    found = sorted(p for p in run.rglob("*.jsonl") if "report" not in p.parts)
    if not found:
        raise ReportError(
            f"{run}: no metrics JSONL found",
            fix="run verl with trainer.logger=[console,file] (make train does) and point RUN= at "
            "the run folder or at $VERL_FILE_LOGGER_PATH",
        )
    return found


def load(run: Path) -> dict[int, dict[str, Any]]:
    """step -> merged metrics of the training steps (later files win a step)."""
    steps: dict[int, dict[str, Any]] = {}
    for path in find_metrics(run):
        for step, data in _read_records(path):
            if "timing_s/step" in data or "perf/time_per_step" in data:
                steps[step] = {**steps.get(step, {}), **data}
    return dict(sorted(steps.items()))


def learning_curve(run: Path) -> Any:
    """tools.launch.learning.Curve of the run: every record (validations too), base_model.json and
    final_eval.json of the run folder."""
    from tools.launch import learning

    records = []
    for path in find_metrics(run):
        for step, data in _read_records(path):
            records.append({"step": step, "data": data})
    c = learning.curve(records)
    folder = run if run.is_dir() else run.parent
    c.base = learning._json(folder / learning.BASE_FILE)
    c.final = learning._json(folder / learning.FINAL_FILE)
    return c


def devices_of(run: Path) -> Devices:
    """World size and report unit from the run's composed recipe (config.yaml) when there is one."""
    folder = run if run.is_dir() else run.parent
    cfg_path = folder / "config.yaml"
    if cfg_path.is_file():
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(cfg_path)
        launch = cfg.get("launch", {})
        if launch and launch.get("nodes") is not None:
            return Devices(
                ranks=float(launch.nodes) * float(launch.devices_per_node),
                dies_per_device=int(launch.get("dies_per_device", 1) or 1),
                unit=str(launch.get("device_unit", "device") or "device"),
            )
    return Devices(ranks=None)


# ---- writing ----


@dataclass
class Report:
    rows: list[dict[str, Any]]
    unit: str
    files: dict[str, Path] = field(default_factory=dict)


def _cell(col: Column, value: Any) -> str:
    if value is None:
        return "-"
    if col.fmt == "{:.1f}" and abs(value) < 10:  # short runs: seconds and lengths below 10 get 2 decimals
        return f"{value:.2f}"
    return col.fmt.format(value)


def markdown(rows: list[dict[str, Any]], unit: str) -> str:
    heads = [c.head.format(unit=unit) for c in COLUMNS]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---:|" * len(heads)]
    lines += ["| " + " | ".join(_cell(c, r.get(c.key)) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def plots(rows: list[dict[str, Any]], title: str) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [r["step"] for r in rows]
    out: dict[str, bytes] = {}
    for name, key, label in (
        ("reward.png", "reward_mean", "reward mean"),
        ("response_length.png", "response_len", "response length (tokens, mean)"),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        ys = [math.nan if r.get(key) is None else r[key] for r in rows]
        ax.plot(steps, ys, marker="o")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.set_title(f"{title}: {label}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        out[name] = _png(fig)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(7.2, 3.8))
    bottom = [0.0] * len(rows)
    for key, label in SPLIT:
        vals = [r.get(key) or 0.0 for r in rows]
        ax.bar(steps, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title(f"{title}: step time split")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7, ncol=4, loc="upper left", bbox_to_anchor=(0, -0.18))
    fig.tight_layout()
    out["step_time.png"] = _png(fig)
    plt.close(fig)
    return out


def learning_html(c: Any) -> str:
    """The learning curve in words and a table: base model, validation accuracy per step, the rise."""
    if c is None or not c.accuracy:
        return ""
    from tools.launch import learning

    s = c.summary()
    cells = "".join(f"<th>{k}</th>" for k in sorted(c.accuracy))
    vals = "".join(f"<td>{v:.3f}</td>" for _, v in sorted(c.accuracy.items()))
    base = ""
    if s["base_sampled_acc"] is not None:
        base = f"<td>{s['base_sampled_acc']:.3f}</td>"
        cells = "<th>base model</th>" + cells
        vals = base + vals
    return (
        f"<h2>Learning curve</h2><p>{html.escape(learning.describe(c))}. Validation accuracy: "
        f"<code>{html.escape(str(c.key))}</code> (mean over samples per held-out problem).</p>"
        f"<table><thead><tr><th>step</th>{cells}</tr></thead>"
        f"<tbody><tr><td>accuracy</td>{vals}</tr></tbody></table>"
    )


def page(
    title: str,
    rows: list[dict[str, Any]],
    unit: str,
    images: dict[str, bytes],
    source: str,
    extra: str = "",
) -> str:
    heads = "".join(f"<th>{html.escape(c.head.format(unit=unit))}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(c, r.get(c.key))}</td>" for c in COLUMNS) + "</tr>" for r in rows
    )
    imgs = "".join(
        f'<figure><img alt="{html.escape(n)}" src="data:image/png;base64,{base64.b64encode(b).decode()}">'
        f"<figcaption>{html.escape(n)}</figcaption></figure>"
        for n, b in images.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body{{font-family:sans-serif;margin:1.5em;color:#222}}
table{{border-collapse:collapse;font-size:13px}}
th,td{{border:1px solid #ccc;padding:3px 7px;text-align:right}}
th{{background:#f3f3f3}}
figure{{display:inline-block;margin:0.5em}}
img{{max-width:100%;border:1px solid #eee}}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>{len(rows)} training steps from {html.escape(source)}. Tokens/s per {html.escape(unit)}: prompt + response
tokens of the step / step time / {html.escape(unit)}s. Reshard: weight sync around the rollout.</p>
<table><thead><tr>{heads}</tr></thead><tbody>{body}</tbody></table>
{extra}
<div>{imgs}</div>
</body></html>
"""


def write(run: Path, out: Path | None = None, devices: float | None = None) -> Report:
    run = Path(run)
    metrics = load(run)
    if not metrics:
        raise ReportError(
            f"{run}: no training step in the metrics yet (records with timing_s/step)",
            fix="wait for the first step of a live run, or check RUN=",
        )
    dev = devices_of(run)
    if devices is not None:
        dev = Devices(ranks=devices * dev.dies_per_device, dies_per_device=dev.dies_per_device, unit=dev.unit)
    rows = [row_from_metrics(s, m, dev) for s, m in metrics.items()]
    folder = run if run.is_dir() else run.parent
    out = Path(out) if out else folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    title = folder.name if run.is_dir() else run.stem
    rep = Report(rows, dev.unit)
    atomic.write_bytes(out / "steps.md", markdown(rows, dev.unit).encode())
    atomic.write_bytes(out / "steps.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    images = plots(rows, title)
    from tools.launch import learning

    curve = learning_curve(run)
    png = learning.plot(curve, title) if curve.accuracy else None
    if png:
        images = {"learning.png": png, **images}
    for name, data in images.items():
        atomic.write_bytes(out / name, data)
        rep.files[name] = out / name
    html_page = page(title, rows, dev.unit, images, str(run), learning_html(curve))
    atomic.write_bytes(out / "report.html", html_page.encode())
    rep.files.update(
        {"steps.md": out / "steps.md", "steps.jsonl": out / "steps.jsonl", "report.html": out / "report.html"}
    )
    return rep


def main(args) -> int:
    rep = write(Path(args.run), Path(args.out) if args.out else None, args.devices)
    print(markdown(rep.rows, rep.unit), end="")
    print(f"wrote {', '.join(str(p) for p in rep.files.values())}")
    return 0
