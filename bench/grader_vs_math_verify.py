"""The project's grader against math-verify on the shipped benchmarks' answers: where they disagree, and
where a person disagrees with either.

    python bench/grader_vs_math_verify.py [--markdown]

Pairs (response answer, reference answer), each with the verdict a person gives:
- every reference answer of AIME 2024, AIME 2025 and MATH-500 against itself (right);
- AIME answers without the answer sheet's leading zeros ("25" for "025": right);
- rewritings of each MATH-500 answer that change its writing, not its value (right): spaces removed,
  \\frac as \\dfrac, \\left/\\right dropped, \\text{}/\\mbox{} unwrapped, degrees dropped, thin spaces
  (,\\!) as plain commas, \\$ dropped;
- tools/reward/equivalents.py: hand-written forms of MATH-500 answers, right and wrong.

"ours" is the reward's verdict (tools/reward: the answer extracted from \\boxed{} inside <answer>, then
mathruler, then math-verify on both sides boxed); "math-verify" is math-verify alone as its README uses
it: verify(parse(gold), parse(response)), the gold as inline LaTeX, the whole response parsed. Prints the
counts and each pair where ours, math-verify and the person do not all agree (--markdown: a table for
docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from math_verify import parse, verify  # noqa: E402

from tools.data.benchmarks import BENCHMARKS, load_benchmark  # noqa: E402
from tools.reward.equivalents import EQUIVALENTS  # noqa: E402
from tools.reward.pool import GradePool  # noqa: E402
from tools.reward.score import score_responses  # noqa: E402

logging.getLogger("math_verify").setLevel(logging.ERROR)

REWRITES: dict[str, Callable[[str], str]] = {
    "spaces removed": lambda s: s.replace(" ", ""),
    "\\dfrac": lambda s: s.replace("\\frac", "\\dfrac"),
    "no \\left \\right": lambda s: s.replace("\\left", "").replace("\\right", ""),
    "\\text unwrapped": lambda s: re.sub(r"\\(?:text|mbox)\{([^{}]*)\}", r"\1", s),
    "no degrees": lambda s: s.replace("^\\circ", "").replace("^{\\circ}", ""),
    "plain commas": lambda s: s.replace(",\\!", ",").replace("\\!", ""),
    "no \\$": lambda s: s.replace("\\$", ""),
}


def respond(answer: str) -> str:
    return f"<think>\nworking\n</think>\n<answer>The answer is \\boxed{{{answer}}}.</answer>"


def pairs() -> list[tuple[str, str, str, bool]]:
    """(where it comes from, answer, gold, a person's verdict)."""
    out: list[tuple[str, str, str, bool]] = []
    for name in BENCHMARKS:
        for p in load_benchmark(name):
            out.append((f"{name} {p.id}: itself", p.answer, p.answer, True))
            if name.startswith("aime") and p.answer != p.answer.lstrip("0") and p.answer.strip("0"):
                out.append((f"{name} {p.id}: no leading zero", p.answer.lstrip("0"), p.answer, True))
    for p in load_benchmark("math500"):
        seen = {p.answer}
        for how, rewrite in REWRITES.items():
            a = rewrite(p.answer)
            if a not in seen:
                seen.add(a)
                out.append((f"math500 {p.id}: {how}", a, p.answer, True))
    gold = {p.id: p.answer for p in load_benchmark("math500")}
    out += [(f"equivalents.py {uid}", a, gold[uid], right) for uid, a, right in EQUIVALENTS]
    return out


def math_verify_alone(answer: str, gold: str) -> bool:
    try:
        g, r = parse(f"${gold}$"), parse(respond(answer))
        return bool(g and r and verify(g, r))
    except Exception:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", action="store_true", help="the disagreements as a markdown table")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = pairs()
    with GradePool(workers=0, time_limit=20.0, use_fast_path=False) as pool:
        ours = score_responses(
            [respond(a) for _, a, _, _ in rows], [g for _, _, g, _ in rows], pool, "accuracy"
        )
    mv = [math_verify_alone(a, g) for _, a, g, _ in rows]
    table = []
    for (where, a, g, person), o, m in zip(rows, ours, mv, strict=True):
        o = bool(o["acc"])
        if not (o == m == person):
            who = "ours" if o == person else "math-verify" if m == person else "neither"
            table.append((where, a, g, o, m, person, who))
    agree = sum(bool(o["acc"]) == m for o, m in zip(ours, mv, strict=True))
    ours_right = sum(bool(o["acc"]) == r[3] for o, r in zip(ours, rows, strict=True))
    mv_right = sum(m == r[3] for m, r in zip(mv, rows, strict=True))
    print(
        f"{len(rows)} pairs; ours and math-verify agree on {agree}; ours as a person on {ours_right}, "
        f"math-verify on {mv_right}; {time.perf_counter() - t0:.1f} s"
    )
    yes = {True: "right", False: "wrong"}
    if args.markdown:
        print("\n| answer | gold | ours | math-verify | a person | who is right | pair |")
        print("|---|---|---|---|---|---|---|")
        for where, a, g, o, m, person, who in table:
            print(f"| `{a}` | `{g}` | {yes[o]} | {yes[m]} | {yes[person]} | {who} | {where} |")
    else:
        for where, a, g, o, m, person, who in table:
            print(
                f"{where}: {a!r} vs {g!r}: ours {yes[o]}, math-verify {yes[m]}, a person {yes[person]} ({who})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
