"""The data card next to a converted dataset: counts, what was dropped and why, a length histogram."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np


def length_histogram(lengths: list[int], unit: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    ax.hist(lengths, bins=50, color="#4477aa")
    ax.set_xlabel(f"prompt length ({unit})")
    ax.set_ylabel("rows")
    ax.set_title(f"{len(lengths)} rows")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def render_card(
    *,
    title: str,
    source: str,
    fmt: str,
    data_source: str,
    style: str,
    seed: int,
    template: str = "r1-zero",
    counts: dict[str, int],
    skipped: Counter[str],
    lengths: list[int],
    unit: str,
    example: list[dict[str, str]] | None,
    example_answer: str | None,
) -> str:
    lines = [
        f"# {title}",
        "",
        f"- source: `{source}` (format `{fmt}`), data_source `{data_source}`",
        f"- prompt template `{template}`, style `{style}` (tools/data/template.py), shuffle seed {seed}",
        "",
        "| step | rows |",
        "|---|---:|",
        *(f"| {k} | {v} |" for k, v in counts.items()),
        "",
    ]
    if skipped:
        lines += ["Skipped malformed rows (`--skip-bad`):", ""]
        lines += [f"- {n} x {reason}" for reason, n in skipped.most_common()]
        lines.append("")
    if lengths:
        a = np.asarray(lengths)
        lines += [
            f"Prompt length ({unit}): min {a.min()}, median {int(np.median(a))}, "
            f"p95 {int(np.percentile(a, 95))}, max {a.max()}",
            "",
            "![prompt lengths](lengths.png)",
            "",
        ]
    if example:
        lines += ["Example (first train row):", "", "```"]
        lines += [f"[{m['role']}] {m['content']}" for m in example]
        lines += [f"[ground_truth] {example_answer}", "```", ""]
    return "\n".join(lines)
