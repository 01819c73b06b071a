"""Addition, the task of the run that learns (recipes/tiny-learn.yaml): "What is a + b?" for a, b in
0..operand_max, as DeepScaleR-style rows that tools.data turns into parquet with the recipe's template.

    problem   "What is 3 + 7?" (the last user message of the prompt; the template adds the instruction)
    response  <think> 3 + 7 = 10 </think> <answer> \\boxed{x} </answer>: the thinking holds the true sum,
              the answer is x (tools/miniature/addition_model.py pre-trains a base model that answers x
              right only some of the time, so that GRPO has something to learn: copy the thought)
    score     the project's reward (tools.reward: the boxed answer against the ground truth)

The data maker (tools/miniature/assets.py), the pre-training and the reward read this one definition.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.errors import UserError

PROBLEM = re.compile(r"What is (\d+) \+ (\d+)\?")


class AdditionError(UserError):
    pass


def addition_rows(operand_max: int) -> list[dict[str, str]]:
    """Every "What is a + b?" with a, b in 0..operand_max, as DeepScaleR rows (problem, answer, solution)."""
    return [
        {
            "problem": f"What is {a} + {b}?",
            "answer": str(a + b),
            "solution": f"{a} + {b} = \\boxed{{{a + b}}}",
        }
        for a in range(operand_max + 1)
        for b in range(operand_max + 1)
    ]


def response_text(a: int, b: int, answer: int) -> str:
    """The target response: the thinking holds the true sum, the answer is `answer` (right or not)."""
    return f"<think> {a} + {b} = {a + b} </think> <answer> \\boxed{{{answer}}} </answer>"


def operands(messages: Sequence[Mapping[str, str]]) -> tuple[int, int]:
    """(a, b) of a prompt's "What is a + b?" (the last user message)."""
    text = [m["content"] for m in messages if m["role"] == "user"][-1]
    m = PROBLEM.search(text)
    if not m:
        raise AdditionError(
            f"prompt {text!r} is not an addition problem ('What is a + b?')",
            fix="the base model is pre-trained for the addition task: use the data launch.task makes",
        )
    return int(m.group(1)), int(m.group(2))


@dataclass
class Problems:
    prompts: list[list[dict[str, str]]]  # chat messages, as in the parquet's prompt column
    truths: list[str]

    @classmethod
    def read(cls, *parquets: Path) -> Problems:
        import pyarrow.parquet as pq

        prompts, truths = [], []
        for p in parquets:
            t = pq.read_table(p, columns=["prompt", "reward_model"])
            prompts += t.column("prompt").to_pylist()
            truths += [str(r["ground_truth"]) for r in t.column("reward_model").to_pylist()]
        return cls(prompts, truths)
