"""The sharpening-or-discovery verdict and the comparison's table and picture from two eval folders."""

from __future__ import annotations

import json
from pathlib import Path

from tools.eval.compare import main, verdict


def test_verdict_rule() -> None:
    base = {"1": 0.2, "64": 0.9}
    assert verdict(base, {"1": 0.6, "64": 0.9}) == "selection"  # pass@1 up, base's pass@64 already as high
    assert verdict(base, {"1": 0.6, "64": 1.0}) == "discovery"  # pass@64 up too
    assert verdict(base, {"1": 0.2, "64": 0.95}) == "no gain"


def folder(path: Path, p1: float, p4: float) -> Path:
    path.mkdir(parents=True)
    pk = {"1": p1, "2": (p1 + p4) / 2, "4": p4}
    summary = {
        "settings": {"sha256": "x"},
        "overall": {"pass@k": pk},
        "by_source": {"addition-3d": {"pass@k": pk}},
    }
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_compare_writes_table_and_png(tmp_path: Path) -> None:
    base, trained = folder(tmp_path / "b", 0.2, 0.8), folder(tmp_path / "t", 0.7, 0.8)
    assert main([str(base), str(trained)]) == 0
    md = (trained / "pass_at_k_vs_base.md").read_text()
    assert "| addition-3d | trained | 0.700 | 0.750 | 0.800 | selection |" in md
    assert (trained / "pass_at_k_vs_base.png").read_bytes()[:4] == b"\x89PNG"
