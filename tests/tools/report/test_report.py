"""Run reports from verl's metrics: the table equals the metrics, the plots are real PNGs, the HTML page
loads in a real headless browser with every section and plot, and tokens/s per device is the published
table's formula. Recorded runs (tests/tools/report/data): tiny-cpu-fsdp on published (verl 0.6.0), and on current
(verl 0.9.1) run-tiny-cpu (trained 3 steps, then resumed for 3 more: two attempts, the reward tally in the
second) and run-tiny-cpu-parallel (PP2 x EP2, the reward tally)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from tools import report as RP
from tools import stacks
from tools.launch import console
from tools.launch import train as T
from tools.launch.__main__ import main as cli_main
from tools.report import build as RB
from tools.report import health as H
from tools.report import runs as RR
from tools.report import summary as S
from tools.report import terminal as TM
from tools.reward import tally

DATA = Path(__file__).parent / "data"
# recorded by `make train BACKEND=fsdp` (tiny-cpu-fsdp, 1 CPU rank): verl 0.6.0's file logger output
RECORDED = DATA / "verl-metrics-tiny-cpu-fsdp.jsonl"
RECORDED_CONFIG = DATA / "config-tiny-cpu-fsdp.yaml"
PARALLEL = DATA / "run-tiny-cpu-parallel"
TINY = DATA / "run-tiny-cpu"
# what the page draws for a run that logged every metric of a panel, and where each plot sits
HEALTH_PNGS = [p.name for p in H.HEALTH]
# the recorded runs (tests/tools/report/data) predate the routing measurement (launch.measure_routing): the
# page says why it is not drawn; test_mismatch.py draws it from a run that logged it
UNRECORDED = ["routing.png"]


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
    assert console.derived(m)["gen"] == 2.02 and console.derived(m)["reshard"] == 0.15


def test_console_lines_of_both_verl_releases():
    # verl 0.6 prints plain floats; verl 0.9's validation prints numpy 2 scalars (np.float64(0.25))
    line = (
        "(TaskRunnerV1 pid=1) step:0 - val-core/x/acc/mean@1:np.float64(0.25) - val-aux/n:np.int64(2) - a:1.5"
    )
    assert console.parse_console_metrics(line) == (
        0,
        {"val-core/x/acc/mean@1": 0.25, "val-aux/n": 2.0, "a": 1.5},
    )


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
    # each plot a real, non-empty PNG; verl 0.6.0's HF rollout returns no log-probs: no rollout_probs.png,
    # the page says why instead
    drawn = ["learning.png", "reward_split.png",
             *[n for n in HEALTH_PNGS if n not in ("rollout_probs.png", *UNRECORDED)],
             "step_time.png", "throughput.png", "paper.png"]  # fmt: skip
    for name in drawn:
        assert_png(out / name)
    assert not (out / "rollout_probs.png").exists()
    page = (out / "report.html").read_text()
    assert (
        page.count("data:image/png;base64,") == len(drawn)
        and 'src="http' not in page
        and "<script" not in page
    )
    assert 'id="absent-rollout_probs"' in page and "rollout (hf" in page


def test_run_folder_formats_and_a_live_run(tmp_path, run_folder):
    # make train's merged metrics.jsonl wins over the raw verl files
    merged = [{"step": s, "kind": "train", "attempt": 1, "metrics": m} for s, m in recorded_steps().items()]
    merged.insert(
        0, {"step": 0, "kind": "validation", "attempt": 1, "metrics": {"val-core/x/acc/mean@1": 0.0}}
    )
    (run_folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in merged))
    assert list(RP.load(run_folder)) == sorted(recorded_steps())
    # a live attempt: make train merges an attempt into metrics.jsonl when it ends, so the steps of a later
    # attempt are read from its verl-metrics-<attempt>.jsonl meanwhile
    resumed = copy_run(TINY, tmp_path / "tiny-cpu")
    first = [
        r for r in map(json.loads, (resumed / "metrics.jsonl").read_text().splitlines()) if r["attempt"] == 1
    ]
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first))
    assert {r["step"] for r in first if r["kind"] == "train"} == {1, 2, 3}
    assert list(RP.load(resumed)) == [1, 2, 3, 4, 5, 6]
    # a live run: the file logger is mid-line
    live = tmp_path / "live.jsonl"
    text = RECORDED.read_text()
    live.write_text(text + text.splitlines()[-1][:50])
    assert len(RP.load(live)) == len(recorded_steps())
    # a broken middle line is an error naming the file and line
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n" + text)
    with pytest.raises(RP.ReportError, match=r"bad.jsonl:1: not JSON"):
        RP.load(bad)
    with pytest.raises(RP.ReportError, match="no such run folder"):
        RP.load(tmp_path / "missing")


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, path
    img = mpimg.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0, path  # not a blank canvas


def copy_run(src: Path, dest: Path, checkpoint: int | None = None) -> Path:
    shutil.copytree(src, dest)
    if checkpoint:
        (dest / "checkpoints" / f"global_step_{checkpoint}").mkdir(parents=True)
        (dest / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(checkpoint))
    return dest


def verl_steps(folder: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for f in sorted(folder.glob("verl-metrics-*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if "timing_s/step" in rec["data"]:
                out[rec["step"]] = rec["data"]
    return out


def test_health_curves_read_verl_names(tmp_path):
    run = copy_run(PARALLEL, tmp_path / "tiny-cpu-parallel")
    r = RR.read(run)
    steps = verl_steps(run)
    # every health panel has its series in verl 0.9.1's metrics, under verl's names, with verl's numbers
    recorded = [panel for panel in H.HEALTH if panel.name not in UNRECORDED]
    for panel in recorded:
        assert H.present(r, panel), panel.name
        for s in H.present(r, panel):
            xs, ys = H.series_of(r, s.key)
            assert xs == sorted(steps) and ys == [steps[x][s.key] for x in xs], s.key
    RP.write(run)
    page = (run / "report" / "report.html").read_text()
    for panel in recorded:
        assert_png(run / "report" / panel.name)
        caption = page.split(f'id="fig-{panel.name[:-4]}"', 1)[1].split("</figure>", 1)[0]
        for s in H.present(r, panel):
            assert f"<code>{s.key}</code>" in caption, (panel.name, s.key)  # the page cites verl's name
    # the truncation in words: response_length/clip_ratio of this run is >= 0.5 at some step
    clip = [m["response_length/clip_ratio"] for m in steps.values()]
    assert max(clip) >= 0.5 and "most responses hit the length limit (data.max_response_length=32" in page


def test_the_validation_line_follows_the_recipes_accuracy_key(tmp_path):
    """Several data sources validated (tiny-zero's digit buckets): the terminal's line names the one the
    recipe judges by (launch.learning.accuracy_key), not the first in the alphabet."""
    from omegaconf import OmegaConf

    run = RR.read(copy_run(TINY, tmp_path / "tiny-cpu"))
    for step, m in run.validations.items():
        m["val-core/addition-1d/acc/mean@4"] = 1.0
        m["val-core/addition-3d/acc/mean@4"] = 0.1 * (step + 1)
    run.config = OmegaConf.create(
        {"launch": {"learning": {"accuracy_key": "val-core/addition-3d/acc/mean@4"}}}
    )
    line = TM.validation_line(run)
    last = max(run.validations)
    assert line.startswith(f"validation accuracy {0.1 * (last + 1):.3f} at step {last}")
    assert "(val-core/addition-3d/acc/mean@4); the other data sources there: " in line
    assert "val-core/addition-1d/acc/mean@4: 1.000" in line  # all of them, the recipe's first
    run.config = OmegaConf.create({})
    assert "(val-core/addition-1d/acc/mean@4); the other" in TM.validation_line(run)


def test_the_pages_headline_is_the_recipes_figure_and_the_terminals_line(tmp_path):
    """tiny-zero's buckets: the page's "Did it learn" leads with the figure the recipe is about
    (launch.learning.accuracy_key, the 3-digit bucket), the terminal's line word for word, and its curve,
    table and rise read that key, not the easiest bucket first in the alphabet."""
    from omegaconf import OmegaConf

    run = RR.read(copy_run(TINY, tmp_path / "tiny-cpu"))
    one, three = "val-core/addition-1d/acc/mean@4", "val-core/addition-3d/acc/mean@4"
    for rec in run.records:
        if any(k.startswith("val-") for k in rec["data"]):
            rec["data"][one] = 1.0
            rec["data"][three] = 0.1 * (rec["step"] + 1)
            run.validations[rec["step"]].update({one: 1.0, three: rec["data"][three]})
    run.config = OmegaConf.create({"launch": {"learning": {"accuracy_key": three}}})
    html = RB.did_it_learn([run], {})
    line = TM.validation_line(run)
    assert three in line
    headline = html.split("<p id=headline><b>", 1)[1].split("</b></p>", 1)[0]
    assert headline == line[0].upper() + line[1:]
    table = html.split("<table id=validation>", 1)[0].rsplit("<p>", 1)[1]
    assert f"<code>{three}</code>" in table and one not in table
    first, last = min(run.validations), max(run.validations)
    assert f"rise {0.1 * (last + 1) - 0.1 * (first + 1):+.3f}" in table  # 3 digits' rise, not 1 digit's 0


def test_a_missing_metric_is_said_not_drawn(tmp_path):
    # a recipe without KL: verl logs no actor/kl_loss; the page gives the reason from config.yaml
    run = copy_run(PARALLEL, tmp_path / "no-kl")
    for f in run.glob("verl-metrics-*.jsonl"):
        recs = [json.loads(x) for x in f.read_text().splitlines()]
        for rec in recs:
            rec["data"].pop("actor/kl_loss", None)
        f.write_text("".join(json.dumps(x) + "\n" for x in recs))
    cfg = (run / "config.yaml").read_text()
    assert "use_kl_loss: true" in cfg
    (run / "config.yaml").write_text(cfg.replace("use_kl_loss: true", "use_kl_loss: false"))
    RP.write(run)
    page = (run / "report" / "report.html").read_text()
    assert not (run / "report" / "kl.png").exists() and 'id="fig-kl"' not in page
    absent = page.split('id="absent-kl"', 1)[1].split("</div>", 1)[0]
    assert "no KL" in absent and "use_kl_loss=false" in absent and "<code>actor/kl_loss</code>" in absent


def test_reward_tally_is_written_by_the_reward_function(tmp_path, monkeypatch):
    from tools.reward import verl_reward

    good = "<think>\nadd them\n</think>\n<answer>\\boxed{2}</answer>"
    monkeypatch.delenv(tally.ENV, raising=False)
    verl_reward.compute_score("x", good, "2", {"split": "train", "index": 0})
    assert not list(tmp_path.iterdir())  # no file logger: no tally
    monkeypatch.setenv(tally.ENV, str(tmp_path / "verl-metrics-3.jsonl"))
    a = verl_reward.compute_score("x", good, "2", {"split": "train", "index": 0})
    b = verl_reward.compute_score("x", "no tags \\boxed{3}", "2", {"split": "train", "index": 1})
    verl_reward.compute_score_batch(["x", "x"], [good, good], ["2", "5"], [{"split": "test"}] * 2)
    assert (a["score"], b["score"]) == (1.0, 0.0)
    lines = tally.read(tmp_path / "reward-tally-3.jsonl")
    assert [(x["split"], x["n"], x["format"], x["acc"]) for x in lines] == [
        ("train", 1, 1.0, 1.0), ("train", 1, 0.0, 0.0), ("test", 2, 2.0, 1.0)
    ]  # fmt: skip
    assert all(x["seconds"] > 0 for x in lines)
    # two responses a step: one step, validation left out
    assert tally.per_step(lines, 2, first_step=7) == {
        7: {"reward/format": 0.5, "reward/accuracy": 0.5, "reward/timeouts": 0.0,
            "reward/seconds": pytest.approx(lines[0]["seconds"] + lines[1]["seconds"])}
    }  # fmt: skip
    assert tally.per_step(lines, 4, first_step=1) == {}  # an incomplete step is not a step


def test_a_part_the_reward_does_not_return_is_not_logged_not_zero(tmp_path):
    """Long addition's reward returns acc, score and trace: no format, no grader timeouts. The tally leaves
    them out, and the page says "not logged" instead of drawing "format ok" at 0."""
    from tools.tasks import long_addition as T

    run = copy_run(TINY, tmp_path / "tiny-cpu")
    for f in run.glob("reward-tally-*.jsonl"):
        n = len(tally.read(f))
        f.unlink()
    monkey = pytest.MonkeyPatch()
    monkey.setenv(tally.ENV, str(run / "verl-metrics-2.jsonl"))
    p = T.parse_problem("12+34=")
    for i in range(n):
        tally.record([T.score(T.response(p, T.FORMATS[i % 2]), p.answer)], [{"split": "train"}], 0.001)
    monkey.undo()
    lines = tally.read(run / "reward-tally-2.jsonl")
    assert len(lines) == n and all("format" not in x and "timeouts" not in x for x in lines)
    RP.write(run)
    page = (run / "report" / "report.html").read_text()
    r = RR.read(run)
    assert r.tally_steps and all("reward/format" not in m for m in r.steps.values())
    assert all(m.get("reward/accuracy") == 1.0 for m in r.steps.values() if "reward/trace" in m)
    note = page.split('id="not-logged-format"', 1)[1].split("</p>", 1)[0]
    assert "format ok" in note and "not logged" in note
    caption = page.split('id="fig-reward_split"', 1)[1].split("</figure>", 1)[0]
    assert "<code>reward/format</code>" not in caption
    assert "grader timeouts not logged" in page


def test_reward_split_per_step_from_the_tally(tmp_path):
    # tiny-cpu-parallel: 4 prompts x 2 responses a step; the tally's training lines, 8 by 8, are steps 1..3
    run = RR.read(PARALLEL)
    lines = [x for x in tally.read(PARALLEL / "reward-tally-1.jsonl") if x["split"] == "train"]
    assert len(lines) == 3 * 8 and run.tally_steps == 3
    for k, step in enumerate((1, 2, 3)):
        block = lines[8 * k : 8 * k + 8]
        assert run.steps[step]["reward/format"] == sum(x["format"] for x in block) / 8
        assert run.steps[step]["reward/accuracy"] == sum(x["acc"] for x in block) / 8
        assert run.steps[step]["reward/timeouts"] == sum(x["timeouts"] for x in block)
    # the resumed tiny-cpu run: attempt 1 had no tally (made before it), attempt 2 trained steps 4..6
    tiny = RR.read(TINY)
    assert [s for s, m in tiny.steps.items() if "reward/format" in m] == [4, 5, 6]
    RP.write(copy_run(TINY, tmp_path / "tiny-cpu"))
    page = (tmp_path / "tiny-cpu" / "report" / "report.html").read_text()
    assert 'id="fig-reward_split"' in page and "<code>reward/format</code>" in page
    assert "grader timeouts over 3 training steps" in page and "val-aux/" in page


def test_reward_column_says_where_the_reward_time_is(tmp_path):
    # verl 0.9.1 logs no timing_s/reward (the reward-loop workers score inside the rollout): the column shows
    # the reward function's own seconds from the tally, marked, and the split does not stack them
    run = RR.read(PARALLEL)
    rows = [RP.row_from_metrics(s, m, run.dev) for s, m in run.steps.items()]
    for r in rows:
        m = run.steps[r["step"]]
        assert "timing_s/reward" not in m
        assert r["reward_in_gen"] and r["reward_s"] == m["reward/seconds"] > 0
        parts = sum(r[k] or 0 for k in ("gen_s", "reshard_s", "old_log_prob_s", "ref_s", "update_s"))
        assert r["other_s"] == pytest.approx(max(0.0, r["step_s"] - parts))
    assert "(in gen)" in RP.markdown(rows, "CPU").splitlines()[2]
    RP.write(copy_run(PARALLEL, tmp_path / "p"))
    note = (tmp_path / "p" / "report" / "report.html").read_text().split('id="reward-column"', 1)[1]
    assert note.startswith(">reward (s) \u201cin gen\u201d: verl 0.9.1 logs no <code>timing_s/reward</code>")
    # the resumed tiny-cpu run: steps 1..3 without a tally ("-"), 4..6 with it; each said
    tiny = RR.read(TINY)
    note = RB.reward_column([RP.row_from_metrics(s, m, tiny.dev) for s, m in tiny.steps.items()])
    assert (
        "\u201cin gen\u201d" in note
        and "\u201c-\u201d: verl logged no" in note
        and "verl's reward phase" not in note
    )
    # verl 0.6.0 logs it: the column is verl's timing_s/reward, stacked
    step, m = next(iter(recorded_steps().items()))
    row = RP.row_from_metrics(step, m, RP.Devices(ranks=1))
    assert row["reward_s"] == m["timing_s/reward"] and not row["reward_in_gen"]


def test_what_ran(tmp_path):
    run = copy_run(TINY, tmp_path / "tiny-cpu", checkpoint=6)
    items = {i.name: i for i in S.items(RR.read(run))}
    timeline = json.loads((run / "timeline.json").read_text())
    assert items["recipe"].value.startswith("tiny-cpu: tiny DeepSeek-V3")
    assert items["overrides"].value == "none (the recipe as written)"  # make train's own are not the user's
    assert items["stack"].value.startswith("current")
    assert items["attempts"].value.startswith("1: from the start, exit 0, 2: resumed after step 3, exit 0")
    wall = sum(a["wall_s"] for a in timeline.values())
    assert items["wall time"].value == f"{wall:.1f} s over 2 attempt(s)"
    peak = max(a["peak_rss_tree_bytes"] for a in timeline.values())
    assert items["peak memory"].value.startswith(f"{peak / 2**30:.2f} GiB")
    assert items["checkpoint"].value == str(run / "checkpoints" / "global_step_6")
    assert "TP1 PP1 EP1" in items["layout"].value and "4 prompts x 2 responses" in items["layout"].value
    par = {i.name: i.value for i in S.items(RR.read(PARALLEL))}
    assert "PP2 EP2" in par["layout"] and "1 node(s) x 4 CPU rank(s)" in par["hardware"]
    RP.write(run)
    page = (run / "report" / "report.html").read_text()
    for name in ("config.yaml", "command.txt"):
        assert (
            f'<a href="../{name}">{name}</a>' in page
        )  # relative: the page reads offline, moved with its run


def test_end_of_run_lines(tmp_path):
    run = copy_run(TINY, tmp_path / "tiny-cpu", checkpoint=6)
    lines = RP.finish(run)
    text = "\n".join(lines)
    last = json.loads((run / "timeline.json").read_text())["2"]
    assert lines[0] == (
        f"done: steps 4..6 in {last['wall_s']:.1f} s wall; peak memory of the process tree "
        f"{last['peak_rss_tree_bytes'] / 2**30:.2f} GiB (RSS summed over its processes: a shared page counts in "
        "each; `make bench-train` measures the PSS)"
    )
    key, _, accs = H.validation(RR.read(run), "acc")
    assert (
        f"validation accuracy {accs[-1]:.3f} at step 6, {accs[-1] - accs[0]:+.3f} since step 0 ({key})"
        in text
    )
    assert "reward flat at 0.000: the tiny model has random weights" in text  # the random tiny model
    assert f"checkpoint: {run}/checkpoints/global_step_6 (the next make train resumes from it)" in text
    assert f"run folder {run}" in text and f"report: {run}/report/report.html" in text
    assert (run / "report" / "report.html").is_file()
    # a reward that moves: no flat line; a trained base model (tiny-learn): not the random-model line
    r = RR.read(run)
    r.steps[5]["critic/score/mean"] = 0.5
    assert TM.flat_reward(r) is None
    r.steps[5]["critic/score/mean"] = 0.0
    r.config.launch.base_model = {"steps": 1}
    assert "random" not in TM.flat_reward(r)
    # a report that cannot be made costs the run nothing: its line says why
    (run / "metrics.jsonl").write_text("{broken\n{}\n")
    assert "report not written" in RP.finish(run)[-1]


def test_compare_two_runs(tmp_path):
    a = copy_run(TINY, tmp_path / "current" / "tiny-cpu")
    b = copy_run(PARALLEL, tmp_path / "current" / "tiny-cpu-parallel")
    rep = RP.write([a, b])
    out = tmp_path / "current" / "compare" / "tiny-cpu_vs_tiny-cpu-parallel"
    assert rep.files["report.html"] == out / "report.html" and [r.label for r in rep.runs] == [
        "tiny-cpu", "tiny-cpu-parallel"]  # fmt: skip
    page = (out / "report.html").read_text()
    assert 'id="steps-0"' in page and 'id="steps-1"' in page
    assert "<th>tiny-cpu</th><th>tiny-cpu-parallel</th>" in page  # the summary: a column a run
    for name in ["learning.png", "reward_split.png", *HEALTH_PNGS, "step_time.png", "throughput.png"]:
        if name not in UNRECORDED:
            assert_png(out / name)
    # both runs' series in one plot: the legend names each run (a label "tiny-cpu: kl_loss" per run)
    kl = H.series_of(RR.read(a), "actor/kl_loss")[1] + H.series_of(RR.read(b), "actor/kl_loss")[1]
    assert len([v for v in kl if v is not None]) == 9
    # same folder names in two stacks: labels keep the stack
    c = copy_run(TINY, tmp_path / "published" / "tiny-cpu")
    assert RR.labels([a, c]) == ["current/tiny-cpu", "published/tiny-cpu"]


def test_make_report_with_two_RUNs(tmp_path):
    """`make report RUN=a RUN=b`: make itself keeps only the last RUN=; the report reads make's command line."""
    import subprocess
    import sys

    a = copy_run(TINY, tmp_path / "tiny-cpu")
    b = copy_run(PARALLEL, tmp_path / "tiny-cpu-parallel")
    out = tmp_path / "cmp"
    r = subprocess.run(["make", "-s", "report", f"PY={sys.executable}", f"RUN={a}", f"RUN={b}", f"OUT={out}"],
                       cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "compared 2 runs: tiny-cpu, tiny-cpu-parallel" in r.stdout
    assert "tiny-cpu vs tiny-cpu-parallel" in (out / "report.html").read_text()


def test_cli(run_folder, capsys):
    assert cli_main(["report", str(run_folder), "--out", str(run_folder / "r2")]) == 0
    out = capsys.readouterr().out
    assert "| step | prompt len |" in out and "report.html" in out


@pytest.mark.slow
def test_html_page_in_headless_chromium(run_folder):
    from tests.tools.report.chromium import find_chromium, inspect_page

    if find_chromium() is None:
        pytest.skip(
            "Chromium is not installed (Debian: apt-get install -y chromium; or set CHROMIUM=<binary>)"
        )
    pytest.importorskip("aiohttp", reason="the DevTools client uses aiohttp")
    # the published run (verl 0.6.0), the current runs (verl 0.9.1: the tiny one resumed, the parallel
    # one) and the two overlaid: every section laid out, every plot loaded, each missing one said
    shots = Path(os.environ.get("REPORT_SCREENSHOTS", run_folder.parent))
    tiny = copy_run(TINY, run_folder.parent / "tiny-cpu", checkpoint=6)
    par = copy_run(PARALLEL, run_folder.parent / "tiny-cpu-parallel", checkpoint=3)
    pages = {
        "published": (RP.write(run_folder), ["rollout_probs", "routing"]),
        "tiny": (RP.write(tiny), ["routing"]),
        "parallel": (RP.write(par), ["routing"]),
        "compare": (RP.write([tiny, par]), ["routing"]),
    }
    # the overlap section's timelines: one a run that recorded its steps' times (both CPU runs did)
    timelines = {"published": [], "tiny": ["timeline.png"], "parallel": ["timeline.png"],
                 "compare": ["timeline-0.png", "timeline-1.png"]}  # fmt: skip
    figs = ["learning", "reward_split", *[n[:-4] for n in HEALTH_PNGS], "step_time", "throughput"]
    for name, (rep, absent) in pages.items():
        seen = inspect_page(rep.files["report.html"], screenshot=shots / f"report-{name}.png")
        ids = seen["ids"]
        for sid in ("summary", "learning", "health", "time"):
            assert ids[sid]["tag"] == "section" and ids[sid]["h"] > 50, (name, sid)
        for fig in figs:
            if fig in absent:
                assert f"fig-{fig}" not in ids and ids[f"absent-{fig}"]["h"] > 10, (name, fig)
                assert "not drawn" in ids[f"absent-{fig}"]["text"]
            else:
                assert ids[f"fig-{fig}"]["w"] > 200, (name, fig)
        images = {i["alt"]: i for i in seen["images"]}
        # a single run's page draws the paper's measure (report/paper.py: validation pass@1 and cons against
        # step); an overlay of runs does not
        paper = [] if name == "compare" else ["paper.png"]
        want = [f"{f}.png" for f in figs if f not in absent] + timelines[name] + paper
        assert sorted(images) == sorted(want), name
        for img in images.values():
            assert img["complete"] and img["w"] > 100 and img["h"] > 100 and img["shown"] > 100, img
        assert seen["errors"] == [], seen["errors"]
        assert "What ran" in ids["summary"]["text"] and "recipe" in ids["summary"]["text"]
        assert (shots / f"report-{name}.png").stat().st_size > 20_000


@pytest.mark.slow
def test_the_browser_check_sees_a_broken_image_and_a_console_error(tmp_path):
    """The browser check can fail: a page with a broken image and a console error is reported as such."""
    from tests.tools.report.chromium import find_chromium, inspect_page

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


def test_make_train_ends_with_the_report(monkeypatch, tmp_path, capsys):
    """make train's call site: after verl, the run's page is written and the end-of-run lines printed
    (verl replaced by the recorded first attempt of tiny-cpu)."""
    from tools.miniature import assets

    monkeypatch.setattr(T, "OUTPUTS", tmp_path / "outputs")
    monkeypatch.setattr(T, "LOCK", tmp_path / "outputs" / ".train.lock")
    monkeypatch.setattr(T.preflight, "trees", lambda cfg, profile: None)
    monkeypatch.setattr(assets, "ensure", lambda *a, **k: None)
    monkeypatch.setattr(assets, "make_data", lambda *a, **k: None)
    recorded = [json.loads(x) for x in (TINY / "verl-metrics-1.jsonl").read_text().splitlines()]

    def recorded_verl(argv, env, run, attempt, out, *settings):
        shutil.copy(TINY / "verl-metrics-1.jsonl", env["VERL_FILE_LOGGER_PATH"])
        (run / "checkpoints" / "global_step_3").mkdir(parents=True)
        (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3")
        steps = {str(r["step"]): float(r["step"]) for r in recorded if "timing_s/step" in r["data"]}
        return 0, [(r["step"], r["data"]) for r in recorded], {"start": 0.0, "steps": steps,
                                                             "peak_rss_tree_bytes": 2**31}  # fmt: skip

    monkeypatch.setattr(T, "run_verl", recorded_verl)
    assert T.main(["--recipe", "tiny-cpu", "--no-plan"]) == 0
    out = capsys.readouterr().out
    run = T.OUTPUTS / stacks.resolve().name / "tiny-cpu"
    assert "done: steps 1..3 in " in out and "peak memory of the process tree 2.00 GiB" in out
    assert "reward flat at 0.000: the tiny model has random weights" in out
    assert f"checkpoint: {run}/checkpoints/global_step_3 (the next make train resumes from it)" in out
    assert f"report: {run}/report/report.html" in out and (run / "report" / "report.html").is_file()
