"""The run's prompt record (tools/launch/prompt_record.py): rows from the reward tally, kept with the trained
steps, reconciled on a resume like metrics.jsonl, and compared with the sequence a run should train on."""

from __future__ import annotations

import json
from pathlib import Path

from tools.launch import prompt_record as P
from tools.launch import resume
from tools.reward import tally

N = 2  # responses a prompt
BATCH = 2  # prompts a step


def line(prompts: list[int], split: str = "train") -> dict:
    return {"split": split, "n": len(prompts), "prompts": prompts, "score": 0.0}


def write_tally(run: Path, attempt: int, lines: list[dict]) -> None:
    path = tally.path_for(run / f"verl-metrics-{attempt}.jsonl")
    assert path is not None
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_reward_function_tallies_each_training_response_s_prompt(tmp_path, monkeypatch):
    monkeypatch.setenv(tally.ENV, str(tmp_path / "verl-metrics-1.jsonl"))
    tally.record(
        [{"score": 1.0}, {"score": 0.0}],
        [{"split": "train", "index": 7}, {"split": "train", "index": 9}],
        0.1,
    )
    tally.record([{"score": 1.0}], [{"split": "test", "index": 3}], 0.1)  # validation: no prompt record
    got = tally.read(tmp_path / "reward-tally-1.jsonl")
    assert got[0]["prompts"] == [7, 9] and "prompts" not in got[1]


def test_sync_rows_are_blocks_of_batch_x_n_responses_from_the_attempt_s_first_step():
    # responses finish out of order and one call may score several; validation lines are not a step's
    lines = [line([4]), line([9, 4]), line([3], "test"), line([9]), line([1, 1, 6]), line([6])]
    rows = P.from_tally(lines, BATCH * N, first_step=3)
    assert rows == {
        3: {"step": 3, "prompts": [4, 9], "responses": [2, 2]},
        4: {"step": 4, "prompts": [1, 6], "responses": [2, 2]},
    }
    # a step cut off in its scoring (the run stopped) has no row; nor a block without prompt ids (an old tally)
    assert sorted(P.from_tally([*lines, line([5])], BATCH * N, 3)) == [3, 4]
    assert P.from_tally([{"split": "train", "n": 4}], BATCH * N, 1) == {}


def test_async_rows_come_from_the_sampler_s_lines_in_the_batch_s_order():
    lines = [
        line([8]),  # the reward function's own lines (scored ahead, some never trained): not the record
        {"split": "train", "step": 1, "n": 4, "prompts": [8, 8, 2, 2], "fetched_for": [1, 1, 1, 1]},
        {"split": "train", "step": 2, "n": 4, "prompts": [5, 5, 3, 3], "fetched_for": [2, 2, 1, 1]},
    ]
    rows = P.from_tally(lines, BATCH * N, 1)
    assert rows[1]["prompts"] == [8, 2] and rows[2] == {
        "step": 2, "prompts": [5, 3], "responses": [2, 2], "fetched_for": [2, 1],
    }  # fmt: skip


def test_only_trained_steps_are_added_and_a_resume_drops_the_later_rows(tmp_path):
    run = tmp_path
    write_tally(run, 1, [line([4, 4, 9, 9]), line([1, 1, 6, 6]), line([2, 2, 7, 7])])
    # attempt 1 scored steps 1..3 but step 3 was never trained (stopped in its update)
    assert P.add_attempt(run, 1, BATCH * N, 1, trained=[1, 2]) == [1, 2]
    assert [r["step"] for r in P.read(run)] == [1, 2]
    said: list[str] = []
    dropped = P.reconcile(run, 1, said.append)  # resumed from step 1's checkpoint
    assert [r["step"] for r in dropped] == [2] and [r["step"] for r in P.read(run)] == [1]
    assert "dropped the prompts of steps 2" in said[0]
    moved = [json.loads(x) for x in (run / "prompts.jsonl.dropped").read_text().splitlines()]
    assert moved[0]["step"] == 2 and moved[0]["resumed_from"] == 1
    # attempt 2 trains steps 2..3 again: the file reads as one run
    write_tally(run, 2, [line([1, 1, 6, 6]), line([2, 2, 7, 7])])
    assert P.add_attempt(run, 2, BATCH * N, 2, trained=[2, 3]) == [2, 3]
    assert [r["prompts"] for r in P.read(run)] == [[4, 9], [1, 6], [2, 7]]
    assert P.reconcile(run, 3, said.append) == []


def test_the_resume_reconciles_the_prompt_record_with_metrics(tmp_path):
    run = tmp_path
    (run / "prompts.jsonl").write_text(
        "".join(json.dumps({"step": s, "prompts": [s]}) + "\n" for s in (1, 2, 3))
    )
    said: list[str] = []
    resume.prepare(run, fresh=False, resume_from=None, recipe="tiny-cpu", stack="current", overrides=[],
                   log=said.append)  # fmt: skip
    assert P.read(run) == [], said  # no checkpoint: a fresh start, every row dropped


def test_compare_names_a_skipped_prompt_a_repeated_one_and_a_cut_group():
    want = {1: [4, 9], 2: [1, 6], 3: [2, 7]}
    same = [{"step": s, "prompts": sorted(p, reverse=True), "responses": [N, N]} for s, p in want.items()]
    assert P.compare(same, want, N) == []  # a step's order is not compared
    # a resume that started the dataloader over: step 2 trains step 1's prompts again, 1 and 6 are skipped
    again = [same[0], {"step": 2, "prompts": [4, 9], "responses": [N, N]}, same[2]]
    problems = P.compare(again, want, N)
    assert any("step 2: prompts [4, 9], expected [1, 6] (skipped [1, 6]" in p for p in problems), problems
    assert any("prompt 4: trained at step 1 and again at step 2" in p for p in problems), problems
    cut = [same[0], {"step": 2, "prompts": [1, 6], "responses": [N, 1]}, same[2]]
    assert P.compare(cut, want, N) == ["step 2: responses per prompt [(6, 1)], expected 2 each"]
    assert P.compare(same[:2], want, N) == ["step 3: no row (its prompts were not recorded)"]
    # a new epoch trains a prompt again, as the uninterrupted run does: not a repeat
    epochs = {1: [4, 9], 2: [9, 4]}
    assert (
        P.compare([{"step": s, "prompts": p, "responses": [N, N]} for s, p in epochs.items()], epochs, N)
        == []
    )
