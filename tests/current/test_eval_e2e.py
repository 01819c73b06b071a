"""`make eval` end to end on this stack's vLLM CPU engine, the CI short form: the tiny-cpu recipe's tiny model
(made and cached under build/tiny by tools/miniature/assets.py, as `make train` makes it) as a run's base model,
its held-out set, K=4 at T 0.6, 8 new tokens. The eval folder is read back and every summary figure
recomputed from the per-response correctness, lengths and answers it holds; a rerun samples nothing.
~60-90 s on a 2-core CPU, most of it the engine's start (measured 2026-11-28)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.eval.consensus import consensus_correct
from tools.eval.passk import pass_at_k
from tools.eval.summary import by_problem

pytest.importorskip("vllm")
REPO = Path(__file__).resolve().parents[2]
K = 4
PROBLEMS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omegaconf import OmegaConf

    from tools.miniature.assets import Assets, ensure
    from tools.recipes.recipe import compose

    cfg = compose("tiny-cpu", [])
    ensure(Assets.from_launch(cfg.launch), mcore=False)
    r = tmp_path_factory.mktemp("run")
    OmegaConf.save(OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)), r / "config.yaml")
    return r


def make_eval(run: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tools.eval", "--run", str(run), "--base", "--bench", "test", "--k", str(K),
           "--limit", str(PROBLEMS), "--max-new-tokens", "8", "--batch", "2"]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_make_eval_writes_what_its_responses_say(run: Path) -> None:
    r = make_eval(run)
    assert r.returncode == 0, r.stderr[-3000:]
    folder = run / "eval" / "step_0" / "test"
    rows = [json.loads(line) for line in (folder / "responses.jsonl").read_text().splitlines()]
    s = json.loads((folder / "summary.json").read_text())["overall"]
    groups = by_problem(rows)
    assert len(groups) == PROBLEMS and all(len(g) == K for g in groups.values())
    assert all(0 < row["length"] <= 8 and row["truncated"] == (row["length"] == 8) for row in rows)
    counts = [(len(g), sum(x["correct"] for x in g)) for g in groups.values()]
    assert s["pass@1"] == pytest.approx(sum(c / n for n, c in counts) / PROBLEMS)
    for k in (1, 2, 4):
        assert s["pass@k"][str(k)] == pytest.approx(sum(pass_at_k(n, c, k) for n, c in counts) / PROBLEMS)
    cons = [consensus_correct([x["pred"] for x in g], [x["correct"] for x in g]) for g in groups.values()]
    assert s[f"cons@{K}"] == pytest.approx(sum(cons) / PROBLEMS)
    assert s["truncation_rate"] == pytest.approx(sum(x["truncated"] for x in rows) / len(rows))
    assert s["mean_length"] == pytest.approx(sum(x["length"] for x in rows) / len(rows))

    before = (folder / "responses.jsonl").read_bytes()
    again = make_eval(run)  # resumed: every problem is done, nothing is sampled again
    assert again.returncode == 0, again.stderr[-3000:]
    assert "problems:" not in again.stderr and (folder / "responses.jsonl").read_bytes() == before
