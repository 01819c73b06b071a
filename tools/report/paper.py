"""The paper's picture on a run's page (DeepSeek-R1, arXiv 2501.12948, Figure 2 and Figure 3): held-out
pass@1 (verl's val mean@N) and cons@N (maj@N) against step, the training responses' mean length beside it,
and the `make eval` summaries of the run's checkpoints (<run>/eval/step_<n>/<bench>/summary.json) as a table.

Where the run is the flagship (recipe deepseek-v3-671b-a3*), the paper's reference points are drawn: AIME
2024 pass@1 15.6% at step 0 and 71.0% at the end of DeepSeek-R1-Zero's RL (Figure 2; Table 2: 71.0).
"""

from __future__ import annotations

import io
import json
from typing import Any

from tools.records import validation_key
from tools.report import page as P
from tools.report.runs import Run

PAPER_START, PAPER_END = 0.156, 0.710  # arXiv 2501.12948 Figure 2: AIME 2024 pass@1, step 0 and the end
FLAGSHIP = "deepseek-v3-671b-a3"


def recipe(run: Run) -> str:
    try:
        return str(run.config.launch.recipe) if run.config is not None else ""
    except Exception:
        return ""


def curves(run: Run) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """data source -> {"pass@1": [(step, mean@N)], "cons": [(step, maj@N/mean)]} from the validations."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for step in sorted(run.validations):
        metrics = run.validations[step]
        for key, value in metrics.items():
            v = validation_key(key)
            if v is None or (v.kind, v.metric) != ("core", "acc") or not isinstance(value, int | float):
                continue
            c = out.setdefault(v.source, {"pass@1": [], "cons": []})
            c["pass@1"].append((step, float(value)))
            maj = metrics.get(f"val-core/{v.source}/acc/maj@{v.n}/mean")
            if isinstance(maj, int | float):
                c["cons"].append((step, float(maj)))
    return out


def lengths(run: Run) -> list[tuple[int, float]]:
    return [
        (s, float(m["response_length/mean"]))
        for s, m in sorted(run.steps.items())
        if isinstance(m.get("response_length/mean"), int | float)
    ]


def eval_summaries(run: Run) -> list[tuple[int, str, dict[str, Any]]]:
    """(step, benchmark, overall summary) of every `make eval` folder of the run, by step."""
    out = []
    for path in sorted((run.folder / "eval").glob("step_*/*/summary.json")):
        step = path.parent.parent.name.removeprefix("step_")
        if step.isdigit():
            try:
                out.append((int(step), path.parent.name, json.loads(path.read_text())["overall"]))
            except (ValueError, KeyError):
                continue
    return sorted(out, key=lambda t: (t[0], t[1]))


def draw(
    run: Run, c: dict[str, dict[str, list[tuple[int, float]]]], length: list[tuple[int, float]]
) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for src, series in c.items():
        if series["pass@1"]:
            line = left.plot(*zip(*series["pass@1"], strict=True), marker="o", label=f"{src} pass@1")[0]
            if series["cons"]:
                left.plot(
                    *zip(*series["cons"], strict=True), "--", color=line.get_color(), label=f"{src} cons"
                )
    if recipe(run).startswith(FLAGSHIP):
        last = max((s for series in c.values() for s, _ in series["pass@1"]), default=0)
        left.scatter([0, last], [PAPER_START, PAPER_END], marker="*", s=120, color="black", zorder=5,
                     label="DeepSeek-R1-Zero AIME24 pass@1 (paper)")  # fmt: skip
    left.set_ylim(0, 1)
    left.set_xlabel("step")
    left.set_ylabel("accuracy")
    left.legend(fontsize=7)
    if length:
        right.plot(*zip(*length, strict=True))
    right.set_xlabel("step")
    right.set_ylabel("mean response length (training)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def section(runs: list[Run], images: dict[str, bytes]) -> str | None:
    """The section of a one-run page (None for an overlay, or a run with neither validations nor evals)."""
    if len(runs) != 1:
        return None
    run = runs[0]
    c, evals = curves(run), eval_summaries(run)
    if not c and not evals:
        return None
    body = []
    if c:
        data = draw(run, c, lengths(run))
        images["paper.png"] = data
        flagship = recipe(run).startswith(FLAGSHIP)
        body.append(P.figure("paper.png", data,
            "Left: held-out pass@1 (<code>val-core/&lt;source&gt;/acc/mean@N</code>) and cons@N (dashed: "
            "<code>maj@N/mean</code>, verl's bootstrap) against step"
            + ("; stars: DeepSeek-R1-Zero's AIME 2024 pass@1, 15.6% at step 0 and 71.0% at the end (arXiv "
               "2501.12948, Figure 2)" if flagship else "")
            + ". Right: the training responses' mean length (Figure 3's measure).", wide=True))  # fmt: skip
    if evals:
        rows = [(f"step {s} · {b}", [f"{o['pass@1']:.3f}" + (f" ± {o['pass@1_stderr']:.3f}" if o.get("pass@1_stderr") else ""),
                 next((f"{v:.3f}" for k, v in o.items() if k.startswith("cons@")), "-"),
                 f"{max(o['pass@k'].values()):.3f}", str(o["samples_per_problem"]), f"{o['truncation_rate']:.1%}"])
                for s, b, o in evals]  # fmt: skip
        body.append("<p><code>make eval</code> summaries (docs/evaluation.md):</p>")
        body.append(P.kv_table(["pass@1", "cons@K", "pass@K", "K", "truncated"], rows))
    return P.section("paper", "By DeepSeek-R1's measure", "\n".join(body))
