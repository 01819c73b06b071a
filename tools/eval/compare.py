"""Sharpening or discovery (Yue et al. 2025): the base model's and a trained checkpoint's pass@k curves on the
same problems, per data source (tiny-zero's digit counts), as a table and a PNG, with the verdict rule:

    trained pass@1 up, and the base's pass@K already as high (within `tol`)  -> selection (sharpening)
    trained pass@1 up, and its pass@K up too                                 -> discovery
    trained pass@1 not up                                                    -> no gain

    python -m tools.eval.compare <base eval folder> <trained eval folder> [--out <png>] [--tol 0.02]

Each folder is one benchmark's eval folder of `make eval` (summary.json), sampled with the same K (64 for
the curve up to 64) on the same problems.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

from tools import atomic
from tools.errors import UserError, run_cli


def verdict(base: dict[str, float], trained: dict[str, float], tol: float = 0.02) -> str:
    """base/trained: pass@k by k (str keys, as summary.json writes them), the same k's."""
    k_max = str(max(int(k) for k in base))
    if trained["1"] <= base["1"] + tol:
        return "no gain"
    if trained[k_max] > base[k_max] + tol:
        return "discovery"
    return "selection"


def curves(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    out = {"overall": summary["overall"]["pass@k"]}
    out.update({s: v["pass@k"] for s, v in summary.get("by_source", {}).items()})
    return out


def read(folder: Path) -> dict[str, Any]:
    path = folder / "summary.json"
    if not path.is_file():
        raise UserError(f"{path}: no summary", fix="run `make eval` for it first (K=64 for the curve to 64)")
    return json.loads(path.read_text())


def table(base: dict[str, Any], trained: dict[str, Any], tol: float) -> list[str]:
    b, t = curves(base), curves(trained)
    if set(b) != set(t) or base["settings"].get("sha256") != trained["settings"].get("sha256"):
        raise UserError(
            "the two eval folders are not of the same problems", fix="evaluate both on one BENCH="
        )
    ks = sorted(set.intersection(*(set(map(int, c)) for c in [*b.values(), *t.values()])))
    lines = ["| source | model | " + " | ".join(f"pass@{k}" for k in ks) + " | verdict |"]
    lines.append("|" + "---|" * (len(ks) + 3))
    for src in b:
        bk = {str(k): b[src][str(k)] for k in ks}
        tk = {str(k): t[src][str(k)] for k in ks}
        v = verdict(bk, tk, tol)
        lines.append(f"| {src} | base | " + " | ".join(f"{bk[str(k)]:.3f}" for k in ks) + " | |")
        lines.append(f"| {src} | trained | " + " | ".join(f"{tk[str(k)]:.3f}" for k in ks) + f" | {v} |")
    return lines


def draw(base: dict[str, Any], trained: dict[str, Any]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b, t = curves(base), curves(trained)
    fig, axes = plt.subplots(1, len(b), figsize=(4 * len(b), 3.2), squeeze=False)
    for ax, src in zip(axes[0], b, strict=True):
        for label, c, style in (("base", b[src], "--"), ("trained", t[src], "-")):
            ks = sorted(map(int, c))
            ax.plot(ks, [c[str(k)] for k in ks], style, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.02)
        ax.set_title(src)
        ax.set_xlabel("k")
    axes[0][0].set_ylabel("pass@k")
    axes[0][0].legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.eval.compare", description=__doc__)
    p.add_argument("base", type=Path)
    p.add_argument("trained", type=Path)
    p.add_argument("--out", type=Path, help="the PNG (default <trained>/pass_at_k_vs_base.png)")
    p.add_argument("--tol", type=float, default=0.02)
    a = p.parse_args(argv)
    base, trained = read(a.base), read(a.trained)
    lines = table(base, trained, a.tol)
    out = a.out or a.trained / "pass_at_k_vs_base.png"
    atomic.write_bytes(out, draw(base, trained))
    atomic.write_bytes(out.with_suffix(".md"), ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))
    print(f"-> {out}, {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    run_cli(main)
