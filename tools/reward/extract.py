"""Find the parts of a response that scoring needs, scanning from the end of the text.

A response of ~2,500 tokens is ~10 KB, and only its tail matters: the last `<answer>...</answer>` block
and the last `\\boxed{...}` inside it. `rfind` and a brace walk over the answer block do that without
running a regular expression over the whole response.

The format the R1-Zero template asks for:  <think> reasoning </think> <answer> ... \\boxed{x} ... </answer>
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
BOXED = "\\boxed"


@dataclass(frozen=True)
class Extracted:
    answer: str | None  # content of the last complete \boxed{} in the answer region; None when there is none
    format_ok: bool  # the strict think/answer format (see `check_format`)
    reason: str  # "ok", or why there is no answer: "empty", "no_boxed", "unclosed_think", "empty_boxed"


def _boxed_at(text: str, pos: int, end: int) -> str | None:
    """Content of the \\boxed group starting at `pos` (the backslash), or None when it is not closed before `end`."""
    i = pos + len(BOXED)
    while i < end and text[i] == " ":
        i += 1
    if i >= end or text[i] != "{":
        return None
    depth = 0
    start = i + 1
    for j in range(i, end):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:j]
    return None


def last_boxed(text: str, start: int = 0, end: int | None = None) -> str | None:
    """The last balanced `\\boxed{...}` in text[start:end] (nested braces allowed), stripped; None if absent.

    An unclosed or bare trailing `\\boxed` (a truncated response) is skipped in favour of an earlier one.
    """
    end = len(text) if end is None else end
    pos = text.rfind(BOXED, start, end)
    while pos != -1:
        content = _boxed_at(text, pos, end)
        if content is not None:
            return content.strip()
        pos = text.rfind(BOXED, start, pos)
    return None


def answer_span(text: str, think_prefilled: bool = False) -> tuple[int, int] | None:
    """Where to look for the final answer, as (start, end); None when the response never finished thinking.

    1. inside the last complete <answer>...</answer> block, if there is one;
    2. else after the last </think>;
    3. else, when no <think> was opened either, the whole response (a model that ignores the tags);
    4. an opened but never closed <think> (truncated mid-thought) has no answer; with `think_prefilled`
       the prompt opened it.
    """
    close = text.rfind(ANSWER_CLOSE)
    if close != -1:
        open_ = text.rfind(ANSWER_OPEN, 0, close)
        if open_ != -1:
            return open_ + len(ANSWER_OPEN), close
    think_close = text.rfind(THINK_CLOSE)
    if think_close != -1:
        return think_close + len(THINK_CLOSE), len(text)
    if think_prefilled or THINK_OPEN in text:
        return None
    return 0, len(text)


def check_format(text: str, think_prefilled: bool = False) -> bool:
    """Strict format: `<think>` non-empty `</think>` `<answer>` ... `\\boxed{non-empty}` ... `</answer>`.

    Only whitespace may come before <think>, between </think> and <answer>, and after </answer>; each tag
    appears exactly once. With `think_prefilled` the prompt already ends in `<think>`, so the response
    must not repeat it.
    """
    n_open = text.count(THINK_OPEN)
    if n_open != (0 if think_prefilled else 1):
        return False
    if text.count(THINK_CLOSE) != 1 or text.count(ANSWER_OPEN) != 1 or text.count(ANSWER_CLOSE) != 1:
        return False
    t_open = -len(THINK_OPEN) if think_prefilled else text.find(THINK_OPEN)
    t_close = text.find(THINK_CLOSE)
    a_open = text.find(ANSWER_OPEN)
    a_close = text.find(ANSWER_CLOSE)
    if not think_prefilled and text[:t_open].strip():
        return False
    if not (t_open + len(THINK_OPEN) <= t_close < a_open < a_close):
        return False
    if not text[max(t_open + len(THINK_OPEN), 0) : t_close].strip():
        return False
    if text[t_close + len(THINK_CLOSE) : a_open].strip() or text[a_close + len(ANSWER_CLOSE) :].strip():
        return False
    boxed = last_boxed(text, a_open + len(ANSWER_OPEN), a_close)
    return bool(boxed)


def extract(text: str | None, think_prefilled: bool = False) -> Extracted:
    """The final answer and the format verdict of one response."""
    if not text or not text.strip():
        return Extracted(None, False, "empty")
    span = answer_span(text, think_prefilled)
    if span is None:
        return Extracted(None, False, "unclosed_think")
    answer = last_boxed(text, *span)
    fmt = check_format(text, think_prefilled)
    if answer is None:
        return Extracted(None, fmt, "no_boxed")
    if not answer:
        return Extracted(None, fmt, "empty_boxed")
    return Extracted(answer, fmt, "ok")
