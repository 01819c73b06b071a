"""What each source dataset looks like, and how to get (problem, answer) out of one record.

A mapper raises RowError(field, message) for a malformed record; the converter adds file and row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tools.reward.extract import last_boxed


class RowError(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Problem:
    problem: str
    answer: str


def get_field(record: Any, path: str) -> Any:
    """record["a"]["b"] for path "a.b"; list items by number ("turns.1.value")."""
    value = record
    for part in path.split("."):
        if isinstance(value, dict):
            if part not in value:
                raise RowError(path, f"missing (the record has {', '.join(map(str, value)) or 'no fields'})")
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit():
            try:
                value = value[int(part)]
            except IndexError:
                raise RowError(path, f"the list has only {len(value)} items") from None
        else:
            raise RowError(path, f"cannot take {part!r} of a {type(value).__name__}")
    return value


def text(value: Any, field: str) -> str:
    """A non-empty string; numbers (answers like 42) become strings."""
    if isinstance(value, bool) or value is None:
        raise RowError(field, f"expected text, got {value!r}")
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str):
        raise RowError(field, f"expected text, got {type(value).__name__}")
    value = value.strip()
    if not value:
        raise RowError(field, "empty")
    return value


def deepscaler(r: Any) -> Problem:
    """DeepScaleR-Preview: a JSON array of {"problem", "answer", "solution"}."""
    return Problem(text(get_field(r, "problem"), "problem"), text(get_field(r, "answer"), "answer"))


def math_lighteval(r: Any) -> Problem:
    """MATH (lighteval): {"problem", "level", "type", "solution"}; the answer is the last \\boxed{} of solution."""
    solution = text(get_field(r, "solution"), "solution")
    answer = last_boxed(solution)
    if not answer:
        raise RowError("solution", "has no \\boxed{...} answer")
    return Problem(text(get_field(r, "problem"), "problem"), answer)


_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


def gsm8k(r: Any) -> Problem:
    """GSM8K: {"question", "answer"}; the final answer follows '####' at the end of answer."""
    full = text(get_field(r, "answer"), "answer")
    m = _GSM8K_ANSWER.search(full)
    if not m:
        raise RowError("answer", "has no '#### <final answer>'")
    return Problem(text(get_field(r, "question"), "question"), m.group(1).replace(",", ""))


def orz(r: Any) -> Problem:
    """ORZ-math-57k: [{"from": "human", "value": q}, {"from": "assistant", "ground_truth": {"value": a}}]."""
    if not isinstance(r, list) or len(r) < 2:
        raise RowError("conversation", "expected a list of two turns (human, assistant)")
    if get_field(r, "0.from") != "human":
        raise RowError("0.from", f"expected 'human', got {r[0].get('from')!r}")
    return Problem(
        text(get_field(r, "0.value"), "0.value"),
        text(get_field(r, "1.ground_truth.value"), "1.ground_truth.value"),
    )


def generic(
    problem_field: str, answer_field: str, answer_from_boxed: bool = False
) -> Callable[[Any], Problem]:
    """Any JSON/JSONL/parquet: dotted field paths; optionally the answer is the last \\boxed{} of that field."""

    def mapper(r: Any) -> Problem:
        answer = text(get_field(r, answer_field), answer_field)
        if answer_from_boxed:
            boxed = last_boxed(answer)
            if not boxed:
                raise RowError(answer_field, "has no \\boxed{...} answer")
            answer = boxed
        return Problem(text(get_field(r, problem_field), problem_field), answer)

    return mapper


# name -> (mapper, default data_source written to the parquet)
FORMATS: dict[str, tuple[Callable[[Any], Problem], str]] = {
    "deepscaler": (deepscaler, "agentica-org/DeepScaleR-Preview-Dataset"),
    "math": (math_lighteval, "DigitalLearningGmbH/MATH-lighteval"),
    "gsm8k": (gsm8k, "openai/gsm8k"),
    "orz": (orz, "Open-Reasoner-Zero/orz_math_57k"),
}
