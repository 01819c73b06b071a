"""Grading with the grader training used: the recipe's reward function (tools/reward/verl_reward.py, by the
name and keyword arguments of verl's custom_reward_function in the run's config), called as verl calls it.

correct = the result's `acc` (deepscaler's `score` adds a format part; `acc` is correctness alone).
pred = the result's `pred` where the reward gives one (verl's maj@N votes on it), else the answer this module
extracts as the reward does: tiny-zero's digits (tools/tasks/long_addition.answer_of), the boxed answer
inside <answer> for the math rewards (tools/reward/extract.py), whitespace removed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tools.errors import UserError
from tools.reward.extract import extract
from tools.tasks.long_addition import answer_of

DEFAULT_REWARD = "compute_score"


@dataclass
class Grader:
    name: str = DEFAULT_REWARD
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from tools.reward import verl_reward  # math_verify, mathruler: only when a grader is made

        fn = getattr(verl_reward, self.name, None)
        if not callable(fn) or not self.name.startswith("compute_score"):
            raise UserError(
                f"reward function {self.name!r} is not in tools/reward/verl_reward.py",
                fix="name one of its compute_score* functions (custom_reward_function.name)",
            )
        if self.name == "compute_score_batch":  # the batch form of compute_score: the same grader
            self.name, fn = "compute_score", verl_reward.compute_score
        self._fn: Callable[..., dict[str, float]] = fn

    @classmethod
    def from_config(cls, config: Any | None) -> Grader:
        from omegaconf import OmegaConf

        if config is None:
            return cls()
        section = OmegaConf.select(config, "verl.reward.custom_reward_function") or OmegaConf.select(
            config, "verl.custom_reward_function"
        )
        if section is None:
            return cls()
        raw = section.get("reward_kwargs")
        kwargs = OmegaConf.to_container(raw, resolve=True) if raw is not None else {}
        return cls(str(section.get("name") or DEFAULT_REWARD), dict(kwargs))

    def grade(self, source: str, text: str, ground_truth: str) -> tuple[bool, str | None]:
        """(correct, pred) of one response."""
        result = self._fn(source, text, ground_truth, {"split": "eval"}, **self.kwargs)
        correct = bool(result.get("acc", result.get("score", 0.0)) >= 1.0)
        pred = result.get("pred")
        return correct, str(pred) if pred not in (None, "") else self.extract(text)

    def extract(self, text: str) -> str | None:
        if "long_addition" in self.name:
            return answer_of(text)
        answer = extract(text, bool(self.kwargs.get("think_prefilled", False))).answer
        return "".join(answer.split()) if answer else None
