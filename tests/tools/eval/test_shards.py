"""`make eval ... SHARD=i/n` (tools/eval/shards.py) with a fake engine in place of vLLM: the shards partition
the problems exactly, three shards give the unsharded run's summary, and a missing shard, a problem sampled
twice, a shard with other settings and a bad SHARD= are refused (exit 2, `error:` and `fix:`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tools.errors import USER_ERROR, UserError, exit_status
from tools.eval import cli
from tools.eval import problems as P
from tools.eval.engine import Completion, Sampling
from tools.eval.shards import Shard, parse_shard

LIMIT, K = 10, 4


class FakeEngine:
    """Answers each problem right, wrong or not at all, chosen by the problem's own sampling seed (as vLLM's
    engine samples a problem alike whichever node or batch it is in)."""

    answers = {str(p.messages): p.ground_truth for p in P.load("aime24", None).problems}
    prompts: list[str] = []

    def __init__(self, model: Path, max_model_len: int, seed: int, cpu_kernels: str = "portable") -> None:
        pass

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        self.prompts.append(str(messages))
        return [len(self.prompts) - 1]

    def sample(self, prompts: list[list[int]], s: Sampling, seeds: list[int]) -> list[list[Completion]]:
        out = []
        for (prompt,), seed in zip(prompts, seeds, strict=True):
            rng, truth = random.Random(seed), self.answers[self.prompts[prompt]]
            texts = [
                rng.choice([f"<think>x</think> <answer>\\boxed{{{truth}}}</answer>", "<answer>\\boxed{7}</answer>", "no"])
                for _ in range(s.k)
            ]  # fmt: skip
            out.append([Completion(t, rng.randint(1, 50), rng.random() < 0.2) for t in texts])
        return out


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cli, "Engine", FakeEngine)
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text("{}")
    return m


def make_eval(model: Path, out: Path, *args: str) -> int:
    argv = ["--model", str(model), "--bench", "aime24", "--k", str(K), "--limit", str(LIMIT), "--batch", "3"]
    return exit_status(cli.main, [*argv, "--out", str(out), *args])


def summary_of(out: Path) -> dict:
    s = json.loads((out / "aime24" / "summary.json").read_text())
    del s["seconds"]
    return s


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_the_shards_take_every_problem_once(n: int) -> None:
    for index in range(23):
        owners = [i for i in range(n) if parse_shard(f"{i}/{n}").owns(index)]
        assert owners == [index % n]


def test_three_shards_summarize_as_one_run(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert make_eval(model, tmp_path / "one") == 0
    assert sorted(p.name for p in (tmp_path / "one" / "aime24").iterdir()) == [
        "responses.jsonl", "settings.json", "summary.json"
    ]  # fmt: skip
    shared = tmp_path / "shared"
    for i in range(3):
        assert make_eval(model, shared, "--shard", f"{i}/3") == 0
        written = lines(shared / "aime24" / f"responses-shard-{i}-of-3.jsonl")
        ids = [p.id for p in P.load("aime24", None).problems[:LIMIT]]
        assert {r["id"] for r in written} == {ids[j] for j in range(LIMIT) if j % 3 == i}
        assert (shared / "aime24" / "summary.json").is_file() == (i == 2)  # written by the last one only
    assert "the summary waits for the others" in capsys.readouterr().out
    one = summary_of(tmp_path / "one")
    assert one["overall"]["pass@1"] not in (0.0, 1.0)  # the fake engine's answers are mixed
    assert summary_of(shared) == one
    (shared / "aime24" / "summary.json").unlink()
    assert make_eval(model, shared, "--summarize") == 0
    assert summary_of(shared) == one
    assert make_eval(model, shared, "--shard", "1/3") == 0  # resumed: nothing sampled again
    assert len(lines(shared / "aime24" / "responses-shard-1-of-3.jsonl")) == 3 * K


def test_a_missing_shard_is_named(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for i in (0, 2):
        assert make_eval(model, tmp_path, "--shard", f"{i}/3") == 0
    capsys.readouterr()
    assert make_eval(model, tmp_path, "--summarize") == USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "3 of 10 problems have no responses" in err
    assert "shards not finished: 1/3)" in err and "  fix: " in err and "SHARD=1/3" in err
    assert not (tmp_path / "aime24" / "summary.json").exists()
    assert make_eval(model, tmp_path, "--shard", "1/3") == 0  # the missing shard: then the summary
    assert (tmp_path / "aime24" / "summary.json").is_file()


@pytest.mark.parametrize("same", [True, False])
def test_a_problem_sampled_twice_is_refused(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture, same: bool
) -> None:
    for i in range(3):
        assert make_eval(model, tmp_path, "--shard", f"{i}/3") == 0
    folder = tmp_path / "aime24"
    twice = [r for r in lines(folder / "responses-shard-2-of-3.jsonl")][:K]  # one whole problem
    if not same:
        twice[0]["text"] += " and more"
    (folder / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in twice))
    capsys.readouterr()
    assert make_eval(model, tmp_path, "--summarize") == USER_ERROR
    err = capsys.readouterr().err
    assert f"problem {twice[0]['id']} has responses in both responses.jsonl and responses-shard-2-of-3" in err
    assert ("the same responses" if same else "different responses") in err and "  fix: " in err


def test_a_shard_with_other_settings_is_refused(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert make_eval(model, tmp_path, "--shard", "0/3") == 0
    capsys.readouterr()
    assert make_eval(model, tmp_path, "--shard", "1/3", "--temperature", "1.0") == USER_ERROR
    assert "other settings (temperature: 0.6 then, 1.0 now)" in capsys.readouterr().err
    assert not (tmp_path / "aime24" / "responses-shard-1-of-3.jsonl").exists()
    # two nodes that started at once: settings.json is the last one's, the shard's own record still differs
    settings = tmp_path / "aime24" / "settings-shard-0-of-3.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "seed": 5}))
    assert make_eval(model, tmp_path, "--shard", "1/3") == USER_ERROR
    err = capsys.readouterr().err
    assert "settings-shard-0-of-3.json: a shard of" in err and "seed: 5 there, 0 here" in err


@pytest.mark.parametrize(
    "text,said",
    [
        ("0/0", "0 shards; at least 1"),
        ("3/2", "shard 3 of 2 does not exist"),
        ("2/2", "shard 2 of 2 does not exist"),
        ("garbage", "SHARD=garbage: not i/n"),
        ("1/x", "must be whole numbers"),
        ("-1/3", "must be whole numbers"),
        ("auto", "SHARD=auto: none of SLURM_NODEID/SLURM_NNODES, RANK/WORLD_SIZE is set"),
    ],
)
def test_bad_shards_are_refused(
    text: str, said: str, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    for name in ("SLURM_NODEID", "SLURM_NNODES", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UserError, match="fix: .*SHARD=i/n with 0 <= i < n"):
        parse_shard(text)
    assert make_eval(model, tmp_path, f"--shard={text}") == USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err
    assert not (tmp_path / "aime24").exists()


def test_shard_auto_reads_the_launcher() -> None:
    assert parse_shard("auto", {"SLURM_NODEID": "2", "SLURM_NNODES": "4", "RANK": "0"}) == Shard(2, 4)
    assert parse_shard("auto", {"RANK": "1", "WORLD_SIZE": "3"}) == Shard(1, 3)
    with pytest.raises(UserError, match=r"SHARD=auto \(RANK, WORLD_SIZE\): shard 3 of 3"):
        parse_shard("auto", {"RANK": "3", "WORLD_SIZE": "3"})
