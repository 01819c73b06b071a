"""Long addition, the task of R1-Zero in miniature (recipes/tiny-zero.yaml): where reasoning length pays.

    problem   "48213+90577=" with both operands of n digits, n = 1..max_digits (the bucket,
              the data source `addition-<n>d`, so that verl logs validation per difficulty)
    direct    <answer>138790</answer>
              the sum at once, most significant digit first: a tiny transformer has to carry across every
              column in one forward pass, which it cannot learn for long numbers on a small budget
    trace     <think>3+7+0=10;1+7+1=9;2+5+0=7;8+0+0=8;4+9+0=13;</think><answer>138790</answer>
              the columns least significant first, each `x+y+carry=s;`, then the same answer tags: every
              step is local and checkable, so the long response is the one a small model gets right
    score     1 for the right sum in the answer tags, whatever the format, else 0 (correctness only: no
              format term that one format could earn and the other not); `trace` says which format the
              response chose (1: it opens with <think>, the tag, whatever follows). No `format` key: the
              reward has no format term, and a key costs every validation time (see `score`).
              `valid_trace` (a trace whose every column is right for the problem) needs the problem,
              which verl does not pass to the reward: tools/analysis/reasoning.py measures it on the
              validation responses, which verl writes with their prompts

The pre-training (tools/miniature/trace_model.py) teaches both formats with a prior for the short one, the data
maker writes these problems, and the reward (tools/reward/verl_reward.py `compute_score_long_addition`)
scores with `score` below: one definition of what a right response is.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)  # one token each in the task's tokenizer
FORMATS = ("direct", "trace")
SOURCE_PREFIX = "addition-"
_PROBLEM = re.compile(r"^(\d+)\+(\d+)=$")
# the tokenizer's chat template for this task: the problem alone, no role markers (a from-scratch model
# learns the format from the pre-training; every prompt token costs CPU time in every step)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
_ANSWER = re.compile(re.escape(ANSWER_OPEN) + r"\s*(\d+)\s*" + re.escape(ANSWER_CLOSE))


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def digits(self) -> int:
        """The bucket: the number of digits of the longer operand."""
        return max(len(str(self.a)), len(str(self.b)))

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def text(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def data_source(self) -> str:
        return source(self.digits)

    def messages(self) -> list[dict[str, str]]:
        """The chat messages verl stores in the parquet's prompt column: the problem alone (the format is
        what the base model learned, not an instruction)."""
        return [{"role": "user", "content": self.text}]


def source(digits: int) -> str:
    return f"{SOURCE_PREFIX}{digits}d"


def digits_of_source(data_source: str) -> int | None:
    """n of `addition-<n>d`, None for another data source."""
    m = re.fullmatch(re.escape(SOURCE_PREFIX) + r"(\d+)d", data_source or "")
    return int(m.group(1)) if m else None


def parse_problem(text: str) -> Problem:
    m = _PROBLEM.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a long-addition problem ('<a>+<b>=')")
    return Problem(int(m.group(1)), int(m.group(2)))


def draw(rng: random.Random, digits: int) -> Problem:
    """Both operands of exactly `digits` digits (0..9 for one digit)."""
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    return Problem(rng.randint(lo, 10**digits - 1), rng.randint(lo, 10**digits - 1))


def problems(
    seed: int, digits: range | list[int], per_bucket: int, exclude: set[Problem] = frozenset()
) -> list[Problem]:
    """`per_bucket` distinct problems of each digit count (as many as exist for small buckets), seeded."""
    rng = random.Random(seed)
    out: list[Problem] = []
    for n in digits:
        space = (10 if n == 1 else 9 * 10 ** (n - 1)) ** 2
        want = min(per_bucket, space - sum(1 for p in exclude if p.digits == n))
        seen: set[Problem] = set()
        while len(seen) < want:
            p = draw(rng, n)
            if p not in exclude:
                seen.add(p)
        out += sorted(seen, key=lambda p: (p.a, p.b))
    return out


def both_orders(ps: set[Problem] | list[Problem]) -> set[Problem]:
    """Each problem and its commuted twin (a + b and b + a: the same sum, the same columns): what a
    held-out set must keep out of every training set, so that no held-out sum is trained on."""
    return {q for p in ps for q in (p, Problem(p.b, p.a))}


def columns(p: Problem) -> Iterator[tuple[int, int, int, int]]:
    """(x, y, carry in, x + y + carry) of each column, least significant first."""
    xs, ys = str(p.a)[::-1], str(p.b)[::-1]
    carry = 0
    for i in range(max(len(xs), len(ys))):
        x = int(xs[i]) if i < len(xs) else 0
        y = int(ys[i]) if i < len(ys) else 0
        s = x + y + carry
        yield x, y, carry, s
        carry = s // 10


def direct_response(p: Problem) -> str:
    return f"{ANSWER_OPEN}{p.answer}{ANSWER_CLOSE}"


def trace_response(p: Problem) -> str:
    steps = "".join(f"{x}+{y}+{c}={s};" for x, y, c, s in columns(p))
    return f"{THINK_OPEN}{steps}{THINK_CLOSE}{direct_response(p)}"


def response(p: Problem, fmt: str) -> str:
    if fmt == "direct":
        return direct_response(p)
    if fmt == "trace":
        return trace_response(p)
    raise ValueError(f"response format {fmt!r} is not one of {', '.join(FORMATS)}")


def prefix(fmt: str) -> str:
    """The first characters of a format's response: generating after them forces that format."""
    return THINK_OPEN if fmt == "trace" else ANSWER_OPEN


def uses_trace(text: str) -> bool:
    """The trace tag: the response opens with the thinking tag (what the trace format starts with). A tag,
    not a trace: `<think>garbage</think>` counts; `valid_trace` is the trace itself."""
    return text.lstrip().startswith(THINK_OPEN)


def valid_trace(text: str, p: Problem) -> bool:
    """The response opens with a valid trace for `p`: inside the thinking tags, every column of this
    problem, least significant first, each `x+y+c=s;` with this problem's digits and carry and the right
    sum, and nothing else (whitespace aside). What the answer after it says is `score`'s business."""
    body = text.lstrip()
    if not body.startswith(THINK_OPEN) or THINK_CLOSE not in body:
        return False
    steps = body[len(THINK_OPEN) : body.index(THINK_CLOSE)]
    return "".join(steps.split()) == "".join(f"{x}+{y}+{c}={s};" for x, y, c, s in columns(p))


def answer_of(text: str) -> str | None:
    """The digits inside the first complete answer tags, or None."""
    m = _ANSWER.search(text)
    return m.group(1).lstrip("0") or "0" if m else None


def score(text: str | None, ground_truth: str) -> dict[str, float]:
    """The reward and what verl logs beside it (`reward_extra_info`): score = acc (correctness only), trace
    (the response used the trace format). Nothing more: verl bootstraps best@n/worst@n of every key for
    every held-out problem at each validation, seconds a key on this CPU."""
    text = text or ""
    got = answer_of(text)
    correct = got is not None and got == (str(ground_truth).strip().lstrip("0") or "0")
    return {"score": float(correct), "acc": float(correct), "trace": float(uses_trace(text))}


def closed(text: str | None) -> bool:
    """The response closed its answer tags around digits (it stopped where a response should)."""
    return answer_of(text or "") is not None


def corpus(ps: list[Problem]) -> list[str]:
    """Texts a tokenizer for the task is trained on: the problems and both formats of their responses."""
    return [t for p in ps for t in (p.text, direct_response(p), trace_response(p))]
