"""Held-out problems are held out: no model or training set sees one.

- tiny-zero (tools/miniature/assets.py long_addition_split, trace_model.py pretrain): a held-out a + b is
  kept out of the GRPO training problems and of the base model's pre-training in both orders, b + a too
  (the same sum, the same columns: training on it would leak the held-out answer);
- tiny-learn (tools/miniature/addition_model.py make): the base model is pre-trained on train.parquet
  alone, never on test.parquet's problems, which the validation scores as "held out"."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tools.miniature import addition_model as B
from tools.miniature import assets as A
from tools.miniature import trace_model as TM
from tools.recipes.recipe import compose, recipe_stacks
from tools.tasks import long_addition as T
from tools.tasks.addition import Problems


def _commuted(ps) -> set[T.Problem]:
    return {T.Problem(p.b, p.a) for p in ps}


def test_both_orders_holds_each_problem_and_its_twin() -> None:
    assert T.both_orders([T.Problem(12, 34), T.Problem(5, 5)]) == {
        T.Problem(12, 34),
        T.Problem(34, 12),
        T.Problem(5, 5),
    }


@pytest.mark.parametrize(
    "task", [{}, {"max_digits": 3, "test": 16, "train": 2000}, {"max_digits": 2, "train_max_digits": 1}]
)
def test_tiny_zero_trains_on_no_held_out_problem_in_either_order(task: dict) -> None:
    train, test = A.long_addition_split(task)
    assert test and train
    leaked = (set(test) | _commuted(test)) & set(train)
    assert (
        not leaked
    ), f"held-out problems (or their b + a) among the training problems: {sorted(leaked, key=str)[:5]}"


def test_tiny_zero_recipe_data_holds_out_both_orders() -> None:
    """The recipe's own task settings (recipes/tiny-zero.yaml), as make train composes them."""
    cfg = compose("tiny-zero", stack=recipe_stacks("tiny-zero")[0])
    from omegaconf import OmegaConf

    train, test = A.long_addition_split(OmegaConf.to_container(cfg.launch.task, resolve=True))
    assert not (_commuted(test) & set(train))
    assert sum(1 for p in test if p.digits == 1) > 0  # the one-digit bucket, where the twins collided most


def test_tiny_zero_pretraining_never_draws_a_held_out_problem_in_either_order() -> None:
    """Every two-digit a + b with a < b held out: the pre-training's draws of two digits may then only be
    a == b (a b + a with a > b is the twin of a held-out one)."""
    held_out = {T.Problem(a, b) for a in range(10, 100) for b in range(a + 1, 100)}
    excluded = T.both_orders(held_out)
    rng = random.Random(0)
    drawn = [TM.draw_pretraining_problem(rng, 2, excluded) for _ in range(400)]
    two = [p for p in drawn if p.digits == 2]
    assert two and all(p.a == p.b for p in two), [p for p in two if p.a != p.b][:5]
    assert any(p.digits == 1 for p in drawn)  # one-digit sums cannot be held out (a table of 100)


def test_tiny_zero_pretrain_excludes_both_orders(monkeypatch) -> None:
    """pretrain hands the draws both orders of its `exclude` (the held-out problems)."""
    seen: list[set] = []

    def fake_draw(rng, max_digits, excluded):
        seen.append(set(excluded))
        raise StopIteration  # enough: the exclusion is what is checked

    monkeypatch.setattr(TM, "draw_pretraining_problem", fake_draw)

    class Tok:
        eos_token_id = pad_token_id = 0

    class Model:
        def parameters(self):
            import torch

            return [torch.nn.Parameter(torch.zeros(1))]

        def train(self):
            pass

    with pytest.raises(StopIteration):
        TM.pretrain(
            Model(), Tok(), TM.Settings(steps=1, batch_size=1), {T.Problem(12, 34)}, log=lambda m: None
        )
    assert seen and T.Problem(34, 12) in seen[0] and T.Problem(12, 34) in seen[0]


@pytest.mark.slow
def test_tiny_learn_base_model_is_pretrained_on_the_training_problems_alone(
    tmp_path: Path, monkeypatch
) -> None:
    """The problems the pre-training gets are train.parquet's, none of test.parquet's (the base model and
    its tokenizer: the tokenizer is trained on the problems' texts and target responses too)."""
    monkeypatch.setenv("ASCEND_R1_LEARN", str(tmp_path / "learn"))
    cfg = compose("tiny-learn", ["launch.base_model.steps=1"], stack=recipe_stacks("tiny-learn")[0])
    a = A.Assets.from_launch(cfg.launch)
    A.make_data(a, log=lambda m: None)
    train, test = Problems.read(a.train_parquet), Problems.read(a.test_parquet)
    assert len(test.prompts) == 20 and len(train.prompts) == 80
    got: dict[str, list] = {}

    def fake_pretrain(model, tok, problems, s, log=print):
        got["pretrain"] = problems.prompts
        return {"seconds": 0.0, "cpu_seconds": 0.0, "final_loss": 0.0, "loss_floor": 0.0}

    def fake_corpus(problems, s):
        got["tokenizer"] = problems.prompts
        return []

    def fake_evaluate(model, tok, problems, s, seed=None):
        got["evaluate"] = problems.prompts
        return {"problems": len(problems.prompts), "greedy_acc": 0.0, "sampled_acc": 0.0, "sampled_format": 0.0,
                "samples_per_problem": 1, "temperature": 1.0}  # fmt: skip

    monkeypatch.setattr(B, "pretrain", fake_pretrain)
    monkeypatch.setattr(B, "task_corpus", fake_corpus)
    monkeypatch.setattr(B, "evaluate", fake_evaluate)
    model_cfg = A.model_config(vocab_size=512, hidden_size=32, intermediate_size=64, moe_intermediate_size=16)
    B.make(tmp_path / "model", B.Settings(steps=1), model_cfg, a.data, log=lambda m: None)
    test_texts = {str(p) for p in test.prompts}
    for part in ("pretrain", "tokenizer"):
        assert got[part] == train.prompts, part
        assert not test_texts & {str(p) for p in got[part]}, f"{part} saw held-out problems"
    assert got["evaluate"] == test.prompts  # and it is scored on the held-out ones
