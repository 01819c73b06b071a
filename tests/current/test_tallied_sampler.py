"""The reward tally per step under separate_async (tools/verl_plugins/tallied_sampler.py, tools/reward/tally.py).

verl 0.9.1's own async sampler (`ReplayBufferAsync`, driven here through its TransferQueue calls, faked)
chooses each step's groups; the reward function is called as responses finish, ahead of their step and for
groups verl later drops. The scenario: 2 prompts a step, 2 responses a prompt, one warm-up batch, staleness
bound 2 (recipes/mode/separate_async.yaml), a warm-up group that finishes too late and is dropped. The
tally must describe, per step, exactly the responses that step trains on; counting blocks of 4 scored
responses in call order (the sync rule) gets steps 2 and 3 wrong and counts the dropped group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from verl.trainer.ppo.v1 import replay_buffer as RB  # the current stack's verl: its V1 trainer's sampler

from tools.launch import prompt_record
from tools.reward import tally, verl_reward
from tools.tasks import long_addition as T
from tools.verl_plugins import tallied_sampler as TS

pytestmark = pytest.mark.upstream
N = 2  # responses a prompt
BATCH = 2  # prompts a step
# each prompt's data row (its extra_info index: the prompt record, tools/launch/prompt_record.py)
ROW = {"p1": 10, "p2": 11, "q1": 12, "q2": 13, "r1": 14, "r2": 15, "w1": 20, "w2": 21}


class FakeTQ:
    """TransferQueue's key-value calls as the replay buffer and the agent loop use them."""

    def __init__(self) -> None:
        self.tags: dict[str, dict] = {}
        self.fields: dict[str, dict] = {}

    def kv_list(self) -> dict[str, dict[str, dict]]:
        return {"train": {k: dict(v) for k, v in self.tags.items()}}

    def kv_clear(self, keys, partition_id) -> None:
        for k in keys:
            self.tags.pop(k, None)
            self.fields.pop(k, None)

    def kv_batch_get(self, keys, partition_id, select_fields=None) -> dict:
        return {f: [self.fields[k][f] for k in keys] for f in select_fields or ("extra_fields", "index")}


@pytest.fixture
def world(tmp_path, monkeypatch):
    fake = FakeTQ()
    monkeypatch.setattr(RB, "tq", fake)
    monkeypatch.setattr(TS, "tq", fake)
    monkeypatch.setenv(tally.ENV, str(tmp_path / "verl-metrics-1.jsonl"))
    return SimpleNamespace(tq=fake, tally=tmp_path / "reward-tally-1.jsonl", problems={}, refills=[])


def dispatch(w, uid: str, step: int) -> None:
    """The trainer hands a prompt to the rollout (verl: `_submit_batch_to_rollout`)."""
    w.tq.tags[uid] = {"is_prompt": True, "status": "running", "global_steps": step}


def finish(w, uid: str, step: int, responses: list[str], problem: str = "48+37=") -> list[dict]:
    """The agent loop: each response scored by the reward function as it finishes (a tally line each),
    then put with its reward results; the group finished."""
    truth = T.parse_problem(problem).answer
    results = []
    for session, text in enumerate(responses):
        r = verl_reward.compute_score_long_addition(
            "addition-2d", text, truth, {"split": "train", "index": ROW[uid]}
        )
        w.tq.tags[f"{uid}_{session}_0"] = {"status": "success", "global_steps": step}
        w.tq.fields[f"{uid}_{session}_0"] = {"extra_fields": {"reward_extra_info": r}, "index": ROW[uid]}
        results.append(r)
    w.tq.tags[uid]["status"] = "finished"
    w.problems[uid] = results
    return results


def train_step(w, sampler, step: int) -> list[str]:
    """The trainer samples its batch (the tallied sampler), trains, and clears the batch's keys."""
    batch, _ = sampler.sample(global_steps=step, partition_id="train", batch_size=BATCH)
    w.tq.kv_clear(batch.keys, "train")
    return sorted({k.split("_")[0] for k in batch.keys})


def expected(w, uids: list[str]) -> dict[str, float]:
    rs = [r for u in uids for r in w.problems[u]]
    traced = [r for r in rs if r["trace"]]
    direct = [r for r in rs if not r["trace"]]
    out = {"reward/accuracy": sum(r["acc"] for r in rs) / len(rs), "reward/trace": len(traced) / len(rs)}
    if traced:
        out["reward/accuracy_with_trace"] = sum(r["acc"] for r in traced) / len(traced)
    if direct:
        out["reward/accuracy_without_trace"] = sum(r["acc"] for r in direct) / len(direct)
    return out


def test_each_step_tallies_the_responses_it_trains_on(world):
    w = world
    p = T.parse_problem("48+37=")
    right, wrong = T.direct_response(p), "<answer>84</answer>"
    traced, traced_wrong = T.trace_response(p), T.trace_response(p).replace("<answer>85", "<answer>86")
    sampler = TS.TalliedReplayBufferAsync(
        trainer_mode="separate_async", trainer_config={}, max_off_policy_threshold=2,
        max_off_policy_strategy="drop", sampler_kwargs={}, poll_interval=0.01,
        refill_fn=lambda k: [dispatch(w, f"refill{len(w.refills)}", 3) or w.refills.append(k) for _ in range(k)],
    )  # fmt: skip
    # warm-up batch (num_warmup_batches 1) and step 1's batch, both issued at step 1
    for uid in ("w1", "w2", "p1", "p2"):
        dispatch(w, uid, 1)
    finish(w, "p1", 1, [right, right])
    finish(w, "w1", 1, [wrong, wrong])
    assert train_step(w, sampler, 1) == ["p1", "w1"]
    dispatch(w, "q1", 2), dispatch(w, "q2", 2)
    finish(w, "q1", 2, [traced, traced])
    finish(w, "p2", 1, [right, wrong])
    assert train_step(w, sampler, 2) == ["p2", "q1"]
    dispatch(w, "r1", 3), dispatch(w, "r2", 3)
    finish(w, "w2", 1, [traced, traced])  # issued at step 1, finished at 3: 3 versions > 2, verl drops it
    finish(w, "q2", 2, [traced_wrong, right])
    finish(w, "r1", 3, [wrong, wrong])
    assert train_step(w, sampler, 3) == ["q2", "r1"] and w.refills == [1]  # w2 dropped and replaced

    lines = tally.read(w.tally)
    steps = tally.per_step(lines, BATCH * N, 1)
    assert sorted(steps) == [1, 2, 3]
    for step, uids in ((1, ["p1", "w1"]), (2, ["p2", "q1"]), (3, ["q2", "r1"])):
        assert steps[step] == pytest.approx(expected(w, uids)), step
    # the reward function's 14 calls are in the file, the dropped group's among them
    assert sum(r["n"] for r in lines if "step" not in r) == 14
    # no part the reward does not return: long addition has no format and no grader timeouts (not 0)
    assert all("reward/format" not in m and "reward/timeouts" not in m for m in steps.values())
    # what the sync rule (blocks of 4 calls) would have said: step 3 from the dropped group's responses
    blocks = tally.per_step([r for r in lines if "step" not in r], BATCH * N, 1)
    assert blocks[3]["reward/trace"] == 0.75 and steps[3]["reward/trace"] == 0.25
    # the prompt record: each step's prompts in its batch's order (verl's: the order the groups finished), the
    # step each was fetched for; the dropped warm-up group (w2) is in no step
    rows = prompt_record.from_tally(lines, BATCH * N, 1)
    assert [(r["step"], r["prompts"], r["responses"], r["fetched_for"]) for r in rows.values()] == [
        (1, [ROW["p1"], ROW["w1"]], [N, N], [1, 1]),
        (2, [ROW["q1"], ROW["p2"]], [N, N], [2, 1]),
        (3, [ROW["q2"], ROW["r1"]], [N, N], [2, 3]),
    ]


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_the_async_modes_use_it_with_the_recipes_poll_interval(mode):
    """verl gives a custom sampler none of its sampler keys: the recipe's poll interval (tiny-cpu: 0.05 s)
    reaches it through sampler_kwargs, or every tiny step would wait verl's 2 s a poll."""
    from pathlib import Path

    from tools.recipes import recipe as R

    s = R.compose_verl(R.compose("tiny-cpu", [f"mode={mode}"], stack="current")).trainer.v1.sampler
    assert s.custom_sampler.name == TS.TalliedReplayBufferAsync.__name__
    assert Path(s.custom_sampler.path) == Path(TS.__file__)
    assert s.sampler_kwargs.poll_interval == s.poll_interval == 0.05
    sampler = TS.TalliedReplayBufferAsync(
        trainer_mode=mode, trainer_config={}, max_off_policy_threshold=2, max_off_policy_strategy="drop",
        sampler_kwargs=s.sampler_kwargs,
    )  # fmt: skip
    assert sampler.poll_interval == 0.05
