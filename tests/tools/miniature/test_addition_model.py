"""The base model of the run that learns (tools/miniature/addition_model.py, tools/tasks/addition.py) and its cache (tools/miniature/assets.py):
the task's problems through the project's data tool and template, answers that are one token each, the
settings checked, and a cache made with other settings re-made with a message naming what changed, never
reused; the same settings reuse it. The pre-training itself is short here (a few steps: the plumbing);
whether the real base model is good enough to learn from is tests/test_learn.py's and the bench's job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import STACK
from tools import stacks
from tools.data.template import SHORT_INSTRUCTION
from tools.miniature import addition_model as B
from tools.miniature import assets as A
from tools.miniature import pretraining as P
from tools.recipes.recipe import compose, recipe_stacks, runs_on
from tools.tasks import addition as AT

REPO = Path(__file__).resolve().parents[3]
# the stack these tests make tiny-learn's assets for: this session's when the recipe runs on it, else the
# first it lists (the base model and its cache are the project's own code, stack-neutral but per stack)
LEARN_STACK = STACK if runs_on("tiny-learn", STACK) else recipe_stacks("tiny-learn")[0]


def test_addition_rows_and_operands() -> None:
    rows = AT.addition_rows(9)
    assert len(rows) == 100 and rows[37] == {
        "problem": "What is 3 + 7?",
        "answer": "10",
        "solution": "3 + 7 = \\boxed{10}",
    }
    assert AT.operands(
        [{"role": "system", "content": "x"}, {"role": "user", "content": "What is 12 + 5?"}]
    ) == (12, 5)
    with pytest.raises(AT.AdditionError, match="not an addition problem"):
        AT.operands([{"role": "user", "content": "What is 2 times 3?"}])
    assert B.expected_sampled_acc(B.Settings(p_correct=0.3, answer_max=18)) == pytest.approx(0.3 + 0.7 / 19)


def test_settings_are_checked() -> None:
    with pytest.raises(B.BaseModelError, match=r"unknown keys \['stpes'\]"):
        B.Settings.from_mapping({"stpes": 3})
    with pytest.raises(B.BaseModelError, match="p_correct=1.5"):
        B.Settings.from_mapping({"p_correct": 1.5})
    assert B.Settings.from_mapping({"steps": 7}).steps == 7


def test_each_answer_is_one_token(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from tools.data.synthetic import tiny_tokenizer
    from tools.data.template import build_prompt

    s = B.Settings()
    problems = AT.Problems(
        [build_prompt(r["problem"], "system", SHORT_INSTRUCTION) for r in AT.addition_rows(9)], []
    )
    tiny_tokenizer(tmp_path / "task", vocab_size=512, extra_corpus=B.task_corpus(problems, s))
    tok = AutoTokenizer.from_pretrained(tmp_path / "task")
    ids, pos = B.answer_tokens(tok, s)
    assert len(set(ids)) == 19 and pos > 0
    # every problem's answer lines up: one token, the same ids, after thinking that holds the sum
    ops = [AT.operands(p) for p in problems.prompts]
    same, where = B.answer_positions(tok, ops, s)
    assert same == ids and len(where) == 100 and all(w > 0 for w in where)
    assert tok.decode(tok(AT.response_text(9, 9, 3))["input_ids"]).startswith("<think> 9 + 9 = 18 </think>")
    # the fixed corpus alone splits some of 0..18 into two tokens: refused, naming the fix
    tiny_tokenizer(tmp_path / "plain", vocab_size=512)
    with pytest.raises(B.BaseModelError, match="(?s)is not one token.*vocab_size"):
        B.answer_tokens(AutoTokenizer.from_pretrained(tmp_path / "plain"), s)


class _WordTokenizer:
    """Whitespace words and the braces of \\boxed{...} as tokens; with `merge`, the answer of the problems
    whose first operand is 9 is glued to its opening brace (as a BPE merge could do)."""

    def __init__(self, merge: bool) -> None:
        self.merge, self.vocab = merge, {}

    def tokenize(self, text: str) -> list[str]:
        glue = self.merge and text.startswith("<think> 9 ")
        out = []
        for w in text.split():
            if w.startswith("\\boxed{"):
                inner = w[len("\\boxed{") : -1]
                out += ["\\boxed", "{" + inner, "}"] if glue else ["\\boxed", "{", inner, "}"]
            else:
                out.append(w)
        return out

    def __call__(self, texts, add_special_tokens: bool = False) -> dict:
        one = isinstance(texts, str)
        ids = [
            [self.vocab.setdefault(w, len(self.vocab)) for w in self.tokenize(t)]
            for t in ([texts] if one else texts)
        ]
        return {"input_ids": ids[0] if one else ids}


def test_a_misaligned_answer_token_is_refused_naming_the_problem() -> None:
    s = B.Settings(answer_max=18)
    ops = [(1, 2), (9, 4)]
    ids, where = B.answer_positions(_WordTokenizer(merge=False), ops, s)
    assert len(set(ids)) == 19 and where == [where[0]] * 2
    with pytest.raises(
        B.BaseModelError,
        match=r"(?s)misaligned answer token in the response to 'What is 9 \+ 4\?'.*vocab_size",
    ):
        B.answer_positions(_WordTokenizer(merge=True), ops, s)


def test_differences_name_the_changed_leaves() -> None:
    old = {"settings": {"steps": 800, "lr": 0.003}, "model_config": {"rope_scaling": {"factor": 4}}}
    new = {"settings": {"steps": 900, "lr": 0.003}, "model_config": {"rope_scaling": {"factor": 8}}, "x": 1}
    assert P.differences(old, new) == [
        "model_config.rope_scaling.factor: 4 -> 8",
        "settings.steps: 800 -> 900",
        "x: <absent> -> 1",
    ]


@pytest.mark.slow
def test_cache_is_remade_with_other_settings_never_reused(tmp_path: Path, monkeypatch) -> None:
    """Data through tools.data with the short template; a base model of a few steps with its result;
    the same settings are reused, other settings re-made with the change named."""
    monkeypatch.setenv("ASCEND_R1_LEARN", str(tmp_path / "learn"))
    small = [
        "launch.base_model.steps=3",
        "launch.base_model.eval_samples=2",
        "launch.base_model.max_new_tokens=24",
    ]
    cfg = compose("tiny-learn", small, stack=LEARN_STACK)
    a = A.Assets.from_launch(cfg.launch)
    assert a.hf_model == tmp_path / "learn" / cfg.launch.stack / "seed-0" / "model"  # a cache per stack
    said: list[str] = []
    A.ensure(a, log=said.append)
    assert any("making the addition problems" in m for m in said), said
    assert any("making the base model" in m for m in said), said
    # the problems went through tools.data: verl's schema, the short template, 20 held out
    test = pq.read_table(a.test_parquet).to_pylist()
    assert len(test) == 20 and len(pq.read_table(a.train_parquet)) == 80
    assert test[0]["prompt"][0] == {"role": "system", "content": SHORT_INSTRUCTION}
    assert test[0]["data_source"] == "addition"
    result = json.loads((a.hf_model / B.RESULT).read_text())
    assert result["settings"]["steps"] == 3 and result["held_out"]["problems"] == 20
    assert {"greedy_acc", "sampled_acc", "sampled_format"} <= set(result["held_out"])
    assert result["held_out"]["samples_per_problem"] == 2
    weights = (a.hf_model / "model.safetensors").read_bytes()

    # the same settings: reused, nothing re-made
    said.clear()
    A.ensure(A.Assets.from_launch(compose("tiny-learn", small, stack=LEARN_STACK).launch), log=said.append)
    assert not any("making" in m for m in said), said
    assert (a.hf_model / "model.safetensors").read_bytes() == weights

    # deterministic from the seed: the same settings made afresh elsewhere give the same weights
    monkeypatch.setenv("ASCEND_R1_LEARN", str(tmp_path / "again"))
    again = A.Assets.from_launch(compose("tiny-learn", small, stack=LEARN_STACK).launch)
    A.ensure(again, log=lambda m: None)
    assert (again.hf_model / "model.safetensors").read_bytes() == weights
    monkeypatch.setenv("ASCEND_R1_LEARN", str(tmp_path / "learn"))

    # other settings: re-made, the change named; the data (same task) is kept
    said.clear()
    other = compose(
        "tiny-learn",
        [*small[:-1], "launch.base_model.steps=4", "launch.base_model.max_new_tokens=24"],
        stack=LEARN_STACK,
    )
    A.ensure(A.Assets.from_launch(other.launch), log=said.append)
    remade = [m for m in said if "re-making it" in m]
    assert len(remade) == 1 and "settings.steps: 3 -> 4" in remade[0] and str(a.hf_model) in remade[0], said
    assert not any("addition problems" in m for m in said), said
    assert json.loads((a.hf_model / B.RESULT).read_text())["settings"]["steps"] == 4

    # a model architecture change (a recipe setting) re-makes it too
    said.clear()
    wider = compose(
        "tiny-learn",
        [*small, "launch.base_model.steps=4", "launch.model_config.hidden_size=48"],
        stack=LEARN_STACK,
    )
    A.ensure(A.Assets.from_launch(wider.launch), log=said.append)
    assert any("model_config.hidden_size: 64 -> 48" in m for m in said), said


@pytest.mark.slow
def test_more_steps_than_batches_is_refused_with_the_fix(tmp_path: Path) -> None:
    """80 training problems / 16 a step = 5 batches an epoch x 10 epochs = 50: 60 steps are refused
    before the base model is made or anything started, with the command that fixes it (the checkout's
    build/learn cache: only the problems are made, in seconds)."""
    import os

    r = subprocess.run(
        [sys.executable, "-m", "tools.launch.train", "--recipe", "tiny-learn", "launch.steps=60"],
        cwd=REPO, env={**os.environ, "ASCEND_R1_OUTPUTS": str(tmp_path / "out"), "ASCEND_R1_STACK": LEARN_STACK},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert (
        "asks for steps 1..60 but the data has 80 training rows // 16 prompts a step = 5 batches" in r.stderr
    )
    assert "x 10 epochs = 50 batches" in r.stderr
    named = "" if stacks.default().name == LEARN_STACK else f" STACK={LEARN_STACK}"  # runs as printed
    fix = f"fix: verl would stop after 50 steps: make train{named} RECIPE=tiny-learn ARGS='launch.steps=60 verl.trainer.total_epochs=12'"
    assert fix in r.stderr
    assert "base model" not in r.stdout and "starting Ray" not in r.stdout
