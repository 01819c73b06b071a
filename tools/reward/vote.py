"""The key a response's answer votes with in a majority vote (verl's maj@N, `make eval`'s cons@k).

verl 0.9.1 computes maj@N for validation when the reward's result carries `pred` (metric_utils
`process_validation_metrics`: the responses to one prompt vote with their `pred`, and the majority's
first response gives maj@N its value). Two answers that the grader's normal form makes equal must vote
together, or a model that writes the same answer two ways loses its majority:

- mathruler's normalisation (the grader's first and cheapest test: `tools.reward.grade`), which turns
  \\dfrac, \\frac12 and a/b into \\frac{a}{b}, drops \\text{} units, \\left/\\right, degrees, spaces;
- then plain numbers (integers, decimals, fractions) by their exact value: 0.5, 1/2 and \\frac{2}{4} all
  vote "1/2", AIME's "025" votes "25"; thousands separators go (10,080 is 10080) and a lettered choice
  loses its parentheses ((C) is C), and a number with a unit word votes as the number and the unit
  (864 inches^2 with 864\\mbox{ inches}^2), as the grader reads them.

Answers equal only after sympy (x^3+3x-6 against 3x+x^3-6) vote apart: voting must stay cheap (one call per
response, no time limit). A response without a final answer votes "" (no answer): it can win the vote,
and then the majority is wrong, as verl counts it (every response votes there).
"""

from __future__ import annotations

import re

from mathruler.math_normalize import normalize_answer as mr_normalize

from tools.reward.grade import plain_number, without_unit

NO_ANSWER = ""
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_CHOICE = re.compile(r"\(([A-Z])\)")


def vote_key(answer: str | None) -> str:
    """The normal form an extracted answer (`tools.reward.extract`) votes with; NO_ANSWER for None."""
    if answer is None or not answer.strip():
        return NO_ANSWER
    try:
        normal = mr_normalize(answer)
    except Exception:  # mathruler's regexes on odd input: fall back to the text itself
        normal = None
    if not normal:
        normal = " ".join(answer.split())
    if _THOUSANDS.fullmatch(normal):  # 10,080 is the grader's 10080
        normal = normal.replace(",", "")
    choice = _CHOICE.fullmatch(normal)  # a multiple-choice letter: (C) is C
    if choice:
        return choice.group(1)
    value = plain_number(normal)
    if value is not None:
        return str(value)
    number_and_unit = without_unit(answer)  # 864 inches^2 and 864\mbox{ inches}^2 vote together; 15 m^2
    if number_and_unit is not None:  # and 15 cm^2 apart (the grader's unit rule tells them apart)
        number, unit = number_and_unit
        value = plain_number(mr_normalize(number))
        return f"{value if value is not None else number} {unit}"
    return normal
