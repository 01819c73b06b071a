"""Run reports from verl's metrics: the table equals the metrics, the plots are real PNGs, the HTML page
loads in a real headless browser, and tokens/s per device is the published table's formula."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from tools.launch import report as RP
from tools.launch import train as T
from tools.launch.__main__ import main as cli_main

DATA = Path(__file__).parent / "data"
# recorded by `make train BACKEND=fsdp` (tiny-cpu-fsdp, 1 CPU rank): verl 0.6.0's file logger output
RECORDED = DATA / "verl-metrics-tiny-cpu-fsdp.jsonl"
RECORDED_CONFIG = DATA / "config-tiny-cpu-fsdp.yaml"


def recorded_steps() -> dict[int, dict]:
    out = {}
    for line in RECORDED.read_text().splitlines():
        rec = json.loads(line)
        if "timing_s/step" in rec["data"]:
            out[rec["step"]] = rec["data"]
    return out


@pytest.fixture
def run_folder(tmp_path) -> Path:
    run = tmp_path / "tiny-cpu-fsdp"
    run.mkdir()
    shutil.copy(RECORDED, run / "verl-metrics-1.jsonl")
    shutil.copy(RECORDED_CONFIG, run / "config.yaml")
    return run


def test_tokens_per_device_is_the_published_formula():
    # The published table (later upstream version, verl recipe/r1_ascend README), step 2: prompt 175.1,
    # response 1385.0 tokens (means), 1044.8 s a step, 95.5 tokens/s per A3; 512 prompts x 16 samples,
    # 256 ranks = 128 A3 packages of 2 dies.
    sequences = 512 * 16
    tokens = (175.1 + 1385.0) * sequences
    per_a3 = RP.tokens_per_s_per_device(tokens, 1044.8, ranks=256, dies_per_device=2)
    assert per_a3 == pytest.approx(95.565, abs=1e-3)
    assert int(per_a3 * 10) / 10 == 95.5  # the table truncates to one decimal
    # per rank or per node would be a different number entirely
    assert RP.tokens_per_s_per_device(tokens, 1044.8, ranks=256) == pytest.approx(47.78, abs=0.01)
    assert RP.tokens_per_s_per_device(tokens, 1044.8, ranks=256, dies_per_device=16) == pytest.approx(
        764.5, abs=0.1
    )
    # Step 27 of the seed run (docs/design.md, launch facts of the 671B run): 1338.3 s and 125.7 tokens/s per A3. With the same
    # formula that is 125.7 x 1338.3 x 128 / 8192 = 2628.6 prompt + response tokens a sequence, inside the
    # seed's limits (prompt 1024 + response 3072); a record with that token count gives back 125.7.
    mean_len = 125.7 * 1338.3 * 128 / sequences
    assert mean_len == pytest.approx(2628.6, abs=0.1) and mean_len <= 1024 + 3072
    row = RP.row_from_metrics(
        27,
        {
            "timing_s/step": 1338.3,
            "perf/total_num_tokens": mean_len * sequences,
            "timing_s/gen": 563.1,
            "timing_s/generate_sequences": 495.5,
            "timing_s/reward": 8.5,
            "timing_s/old_log_prob": 134.1,
            "timing_s/ref": 116.7,
            "timing_s/update_actor": 495.2,
        },
        RP.Devices(ranks=256, dies_per_device=2, unit="A3"),
    )
    assert round(row["tokens_per_s_per_device"], 1) == 125.7
    assert (row["gen_s"], round(row["reshard_s"], 1)) == (495.5, 67.6)  # reshard = gen - generate_sequences


def test_server_mode_generation_and_weight_sync():
    # verl 0.9 (current stack) logs no generate_sequences: the gen phase is the agent loop against the vLLM
    # servers and update_weights is the weight sync from the actor (the reshard column)
    m = {"timing_s/gen": 2.02, "timing_s/update_weights": 0.15, "timing_s/step": 12.7}
    row = RP.row_from_metrics(1, m, RP.Devices(ranks=1))
    assert (row["gen_s"], row["reshard_s"]) == (2.02, 0.15)
    assert T.derived(m)["gen"] == 2.02 and T.derived(m)["reshard"] == 0.15


def test_console_lines_of_both_verl_releases():
    # verl 0.6 prints plain floats; verl 0.9's validation prints numpy 2 scalars (np.float64(0.25))
    line = (
        "(TaskRunnerV1 pid=1) step:0 - val-core/x/acc/mean@1:np.float64(0.25) - val-aux/n:np.int64(2) - a:1.5"
    )
    assert T.parse_console_metrics(line) == (0, {"val-core/x/acc/mean@1": 0.25, "val-aux/n": 2.0, "a": 1.5})


def test_verl_throughput_gives_the_same_number():
    # verl: perf/throughput = total tokens / (step time x n_gpus); per device = that x dies per device
    for step, m in recorded_steps().items():
        row = RP.row_from_metrics(step, m, RP.Devices(ranks=None))  # ranks derived from verl's numbers
        assert row["tokens_per_s_per_device"] == pytest.approx(m["perf/throughput"], rel=1e-9)


def test_report_on_a_recorded_metrics_file(run_folder):
    rep = RP.write(run_folder)
    out = run_folder / "report"
    steps = recorded_steps()
    assert [r["step"] for r in rep.rows] == sorted(steps) and len(steps) >= 3
    # the table's numbers are the metrics
    for r in rep.rows:
        m = steps[r["step"]]
        assert r["prompt_len"] == m["prompt_length/mean"] and r["response_len"] == m["response_length/mean"]
        assert r["step_s"] == m["timing_s/step"] and r["reward_mean"] == m["critic/rewards/mean"]
        assert r["gen_s"] == m["timing_s/generate_sequences"]
        assert r["reshard_s"] == pytest.approx(m["timing_s/gen"] - m["timing_s/generate_sequences"])
        assert (r["reward_s"], r["old_log_prob_s"], r["ref_s"], r["update_s"]) == (
            m["timing_s/reward"],
            m["timing_s/old_log_prob"],
            m["timing_s/ref"],
            m["timing_s/update_actor"],
        )
        assert r["tokens_per_s_per_device"] == pytest.approx(
            m["perf/total_num_tokens"] / m["timing_s/step"] / 1
        )
    # JSONL: the same rows
    lines = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert lines == json.loads(json.dumps(rep.rows))
    # markdown: the header says the unit of config.yaml, each cell is the metric formatted
    md = (out / "steps.md").read_text().splitlines()
    assert "tokens/s per CPU" in md[0]
    first = steps[min(steps)]
    cells = [c.strip() for c in md[2].strip("|").split("|")]
    assert cells[0] == str(min(steps)) and cells[3] == f"{first['timing_s/step']:.2f}"  # < 10 s: 2 decimals
    assert (
        cells[1] == f"{first['prompt_length/mean']:.1f}"
        and cells[11] == f"{first['critic/rewards/mean']:.3f}"
    )
    assert cells[4] == f"{first['perf/total_num_tokens'] / first['timing_s/step']:.1f}"
    # each plot a real, non-empty PNG
    for name in ("learning.png", "reward.png", "response_length.png", "step_time.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
        img = mpimg.imread(out / name)
        assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0  # not a blank canvas
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and 'src="http' not in page and "<script" not in page


def test_run_folder_formats_and_a_live_run(tmp_path, run_folder):
    # make train's merged metrics.jsonl wins over the raw verl files
    merged = [{"step": s, "kind": "train", "attempt": 1, "metrics": m} for s, m in recorded_steps().items()]
    merged.insert(
        0, {"step": 0, "kind": "validation", "attempt": 1, "metrics": {"val-core/x/acc/mean@1": 0.0}}
    )
    (run_folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in merged))
    assert [r["step"] for r in RP.write(run_folder).rows] == sorted(recorded_steps())
    # a live run: the file logger is mid-line
    live = tmp_path / "live.jsonl"
    text = RECORDED.read_text()
    live.write_text(text + text.splitlines()[-1][:50])
    assert len(RP.write(live, tmp_path / "out").rows) == len(recorded_steps())
    # a broken middle line is an error naming the file and line
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n" + text)
    with pytest.raises(RP.ReportError, match=r"bad.jsonl:1: not JSON"):
        RP.load(bad)
    with pytest.raises(RP.ReportError, match="no such run folder"):
        RP.load(tmp_path / "missing")


def test_cli(run_folder, capsys):
    assert cli_main(["report", str(run_folder), "--out", str(run_folder / "r2")]) == 0
    out = capsys.readouterr().out
    assert "| step | prompt len |" in out and "report.html" in out


@pytest.mark.slow
def test_html_page_in_headless_chromium(run_folder):
    from tests.launch.chromium import find_chromium, inspect_page

    if find_chromium() is None:
        pytest.skip(
            "Chromium is not installed (Debian: apt-get install -y chromium; or set CHROMIUM=<binary>)"
        )
    pytest.importorskip("aiohttp", reason="the DevTools client uses aiohttp")
    RP.write(run_folder)
    seen = inspect_page(run_folder / "report" / "report.html")
    assert len(seen["images"]) == 4, seen
    for img in seen["images"]:
        assert img["complete"] and img["w"] > 100 and img["h"] > 100, img
    assert seen["errors"] == [], seen["errors"]


@pytest.mark.slow
def test_the_browser_check_sees_a_broken_image_and_a_console_error(tmp_path):
    """The browser check can fail: a page with a broken image and a console error is reported as such."""
    from tests.launch.chromium import find_chromium, inspect_page

    if find_chromium() is None:
        pytest.skip(
            "Chromium is not installed (Debian: apt-get install -y chromium; or set CHROMIUM=<binary>)"
        )
    pytest.importorskip("aiohttp")
    page = tmp_path / "bad.html"
    page.write_text(
        '<html><body><img alt="x" src="data:image/png;base64,AAAA">'
        "<script>console.error('boom')</script></body></html>"
    )
    seen = inspect_page(page)
    assert seen["images"][0]["w"] == 0
    assert any("boom" in e for e in seen["errors"])
