"""Reward scoring: the fast path (cache + fast verdicts + worker processes) against a plain loop.

    python bench/bench_reward.py [--prompts 512] [--group 16] [--workers 2] [--time-limit 5]

The mix imitates one GRPO step: P prompts x G responses of ~2,500 tokens (~10 KB of reasoning).
Per prompt a solve rate p ~ U(0, 1). A response is
  - malformed with 14%: truncated inside <think> (8%), an answer without \\boxed (3%), no tags at all
    (2%), empty (0.5%), text after </answer> (0.5%);
  - else correct with probability p, written in the canonical form (70%) or an equivalent other form
    (30%: decimal for a fraction, \\dfrac, a/b, unreduced fraction, \\sqrt{12} for 2\\sqrt{3}, pi/4, units,
    reordered terms, spaced intervals);
  - else wrong: one of the prompt's 3 typical mistakes (80%) or a one-off wrong value (20%).
Ground truths: integers 45%, fractions 15%, surds 10%, pi 10%, intervals 5%, polynomials 10%, decimals 5%.

Baseline: for each response, the same extraction and the same graders in a plain loop: mathruler, then
math-verify where mathruler says no, under the same per-response time limit (SIGALRM), no cache, no
fast path, one process. Both runs must give identical scores. Then:
- grader disagreement on the distinct (answer, ground truth) pairs, against the label the generator
  knows (equivalent by construction or not);
- pathological answers appended (a slow sympy sum, towers of powers sympy works on for minutes): the
  slowest response in the fast path must stay under time limit + grace.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.reward.extract import extract  # noqa: E402
from tools.reward.grade import grade_timed, math_verify_says, mathruler_says, warm_up  # noqa: E402
from tools.reward.pool import GradePool  # noqa: E402
from tools.reward.score import combine, score_responses  # noqa: E402

WORDS = (
    "so we need to compute the value of the expression first note that since therefore let us check "
    "the case where x is positive then substitute back and simplify wait that is not right again "
    "\\frac{a}{b} = \\sqrt{2} x^2 + 3x - 1 \\cdot \\left( n + 1 \\right) \\implies \\le \\ge"
).split()


def filler(rng: random.Random, n_chars: int) -> str:
    out, size = [], 0
    while size < n_chars:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def make_truth(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """(ground truth, equivalent other forms, typical wrong answers)."""
    kind = rng.choices(["int", "frac", "surd", "pi", "interval", "poly", "dec"], [45, 15, 10, 10, 5, 10, 5])[
        0
    ]
    if kind == "int":
        n = rng.randint(-50, 2000)
        forms = [f"{n}.0", f"{n} \\text{{ cm}}", f"x = {n}", f"{{{n}}}"]
        if n >= 1000:
            forms.append(f"{n:,}")
        return str(n), forms, [str(n + 1), str(n - 1), str(-n if n else 7), str(2 * n + 3)]
    if kind == "frac":
        b = rng.choice([2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 20, 25])
        a = rng.choice([k for k in range(1, 3 * b) if Fraction(k, b).denominator == b])
        forms = [f"\\dfrac{{{a}}}{{{b}}}", f"{a}/{b}", f"\\frac{{{2 * a}}}{{{2 * b}}}"]
        if b in (2, 4, 5, 8, 16, 20, 25):
            forms.append(str(float(Fraction(a, b))))
        return (
            f"\\frac{{{a}}}{{{b}}}",
            forms,
            [
                f"\\frac{{{b}}}{{{a}}}",
                f"\\frac{{{a + 1}}}{{{b}}}",
                f"{a / b:.2f}" if b in (3, 6, 7, 9, 12) else f"\\frac{{{a}}}{{{b + 1}}}",
            ],
        )
    if kind == "surd":
        k, m = rng.choice([2, 3, 4, 5]), rng.choice([2, 3, 5, 6, 7])
        return (
            f"{k}\\sqrt{{{m}}}",
            [f"\\sqrt{{{k * k * m}}}", f"{k} \\sqrt {m}"],
            [f"\\sqrt{{{k * m}}}", f"{k}\\sqrt{{{m + 1}}}", f"{k + 1}\\sqrt{{{m}}}"],
        )
    if kind == "pi":
        k = rng.choice([2, 3, 4, 6, 8, 12])
        return (
            f"\\frac{{\\pi}}{{{k}}}",
            [f"\\pi/{k}", f"\\frac{{1}}{{{k}}}\\pi"],
            [f"\\frac{{\\pi}}{{{k + 1}}}", f"{3.14159 / k:.3f}", f"\\frac{{{k}}}{{\\pi}}"],
        )
    if kind == "interval":
        a, b = sorted(rng.sample(range(-20, 20), 2))
        return (
            f"[{a}, {b})",
            [f"[{a},{b})", f"\\left[{a}, {b}\\right)"],
            [f"({a}, {b})", f"[{a}, {b}]", f"[{a}, {b + 1})"],
        )
    if kind == "poly":
        a, c = rng.randint(1, 9), rng.randint(1, 9)
        return (
            f"x^2 + {a}x + {c}",
            [f"{a}x + x^2 + {c}", f"x^{{2}}+{a}x+{c}"],
            [f"x^2 + {a}x - {c}", f"x^2 - {a}x + {c}", f"x^2 + {c}x + {a}"],
        )
    d = rng.randint(1, 999) / 100
    return f"{d}", [f"{d}0", f"\\${d}"], [f"{d + 0.01:.2f}", f"{d * 10:.1f}", f"{-d}"]


def response(rng: random.Random, think: str, answer: str | None, kind: str) -> str:
    if kind == "truncated":
        return f"<think>\n{think}"
    if kind == "empty":
        return ""
    if kind == "no_boxed":
        return f"<think>\n{think}\n</think>\n<answer>\nThe answer is {answer}.\n</answer>"
    if kind == "no_tags":
        return f"{think}\nSo the answer is \\boxed{{{answer}}}."
    tail = " Let me know if you need more." if kind == "trailing" else ""
    return f"<think>\n{think}\n</think>\n<answer>\nTherefore the final answer is \\boxed{{{answer}}}.\n</answer>{tail}"


def make_mix(prompts: int, group: int, seed: int = 0) -> tuple[list[str], list[str], list[bool | None]]:
    """responses, ground truths, and per response the construction label (None: no answer to grade)."""
    rng = random.Random(seed)
    thinks = [filler(rng, 10_000) for _ in range(64)]
    responses, truths, labels = [], [], []
    for _ in range(prompts):
        truth, forms, mistakes = make_truth(rng)
        p = rng.random()
        for _ in range(group):
            think = rng.choice(thinks)
            r = rng.random()
            if r < 0.14:
                kind = rng.choices(
                    ["truncated", "no_boxed", "no_tags", "empty", "trailing"], [8, 3, 2, 0.5, 0.5]
                )[0]
            else:
                kind = "ok"
            if rng.random() < p:
                answer, label = (truth if rng.random() < 0.7 else rng.choice(forms)), True
            elif rng.random() < 0.8:
                answer, label = rng.choice(mistakes), False
            else:
                answer, label = str(rng.randint(-10_000, 10_000)), False
            responses.append(response(rng, think, answer, kind))
            truths.append(truth)
            labels.append(None if kind in ("truncated", "empty", "no_boxed") else label)
    return responses, truths, labels


# (answer, ground truth, equal?) checked by hand: forms the generated mix does not cover
HAND_CHECKED = [
    (r"\frac{2}{4}", r"\frac12", True),
    (r"-\frac{1}{2}", r"\frac{-1}{2}", True),
    (r"\dfrac{7}{2}", "3.5", True),
    (r"10^{-3}", "0.001", True),
    (r"2^{10}", "1024", True),
    (r"\sqrt[3]{8}", "2", True),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
    (r"\log_2 8", "3", True),
    (r"\binom{5}{2}", "10", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("k = 4", "4", True),
    (r"3\text{ cm}", "3", True),
    (r"5\text{ meters}", "5", True),
    (r"\text{(B)}", "B", True),
    ("1,000", "1000", True),
    (r"\{1, 2\}", "1, 2", True),
    (r"\$18.90", "18.90", True),
    (r"50\%", "50", True),
    (r"0.333", r"\frac13", False),
    (r"6.283", r"2\pi", False),
    ("(1,2)", "(2,1)", False),
    ("1000000000000000001", "1000000000000000000", False),
    (r"\frac{3}{4}\text{ of the cake}", r"\frac34", True),
    ("x > 3", "(3, \\infty)", True),
]


def baseline(responses: list[str], truths: list[str], time_limit: float) -> list[float]:
    """A plain single-process loop: extract, mathruler, then math-verify; no cache, no fast path."""
    out = []
    for resp, truth in zip(responses, truths, strict=True):
        ex = extract(resp)
        v = grade_timed(ex.answer, truth, time_limit)
        out.append(combine("deepscaler", ex.format_ok, v.correct))
    return out


def fresh() -> None:
    """Forget what earlier runs in this process cached (math-verify's parse caches, sympy's cache), then
    warm up like a worker does: each timed run starts from the same state."""
    import sympy.core.cache
    from math_verify import parser

    parser.parse_latex_cached.cache_clear()
    parser.parse_expr_cached.cache_clear()
    sympy.core.cache.clear_cache()
    warm_up()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=5.0)
    ap.add_argument("--grace", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    responses, truths, labels = make_mix(args.prompts, args.group, args.seed)
    n = len(responses)
    mean_chars = sum(map(len, responses)) / n
    print(
        f"mix: {n} responses ({args.prompts} prompts x {args.group}), mean {mean_chars:,.0f} chars (~{mean_chars / 4:,.0f} tokens), {os.cpu_count()} CPUs"
    )

    pool = GradePool(workers=args.workers, time_limit=args.time_limit, grace=args.grace)
    pool.start()  # workers start (and warm up) once per training run, outside the timing

    t = time.perf_counter()
    fast = [r["score"] for r in score_responses(responses, truths, pool, "deepscaler")]
    t_fast = time.perf_counter() - t
    fresh()
    t = time.perf_counter()
    base = baseline(responses, truths, args.time_limit)
    t_base = time.perf_counter() - t

    # where the speed comes from: the same cache and fast path in this one process, no workers
    solo = GradePool(workers=0, time_limit=args.time_limit)
    fresh()
    t = time.perf_counter()
    solo_scores = [r["score"] for r in score_responses(responses, truths, solo, "deepscaler")]
    t_solo = time.perf_counter() - t

    same = sum(a == b for a, b in zip(fast, base, strict=True))
    print(f"baseline (plain loop, 1 process) : {t_base:8.2f} s  {1e3 * t_base / n:6.2f} ms/response")
    print(
        f"fast path ({args.workers} workers, cache)     : {t_fast:8.2f} s  {1e3 * t_fast / n:6.2f} ms/response"
    )
    print(
        f"  same, 1 process (no workers)   : {t_solo:8.2f} s  {1e3 * t_solo / n:6.2f} ms/response  "
        f"({t_base / t_solo:.2f} x; identical: {solo_scores == base})"
    )
    print(f"speed-up                         : {t_base / t_fast:8.2f} x")
    print(f"identical scores                 : {same}/{n}" + ("" if same == n else "  <-- MISMATCH"))
    print(f"score distribution               : {dict(sorted(Counter(fast).items()))}")
    print(f"how pairs were settled           : {dict(pool.stats.most_common())}")
    print(f"slowest single grading           : {pool.max_task_seconds:.2f} s")

    # grader disagreement on distinct pairs, judged by the construction label
    pairs: dict[tuple[str, str], bool] = {}
    for resp, truth, label in zip(responses, truths, labels, strict=True):
        ans = extract(resp).answer
        if ans is not None and label is not None:
            pairs[(ans, truth)] = label
    agree = mr_right = mv_right = 0
    examples: list[str] = []
    for (ans, truth), label in pairs.items():
        mr, mv = mathruler_says(ans, truth), math_verify_says(ans, truth)
        if mr == mv:
            agree += 1
            continue
        mr_right += mr == label
        mv_right += mv == label
        examples.append(
            f"    answer {ans!r:32} truth {truth!r:24} equal={label!s:5} mathruler={mr!s:5} math-verify={mv}"
        )
    dis = len(pairs) - agree
    print(
        f"grader disagreement              : {dis}/{len(pairs)} distinct pairs ({100 * dis / len(pairs):.1f}%); "
        f"right by construction: mathruler {mr_right}, math-verify {mv_right}"
    )
    for e in sorted(set(examples))[:40]:
        print(e)

    rows = []
    hand_dis = hand_mr = hand_mv = hand_chain = 0
    for ans, truth, label in HAND_CHECKED:
        mr, mv = mathruler_says(ans, truth), math_verify_says(ans, truth)
        hand_chain += (mr or mv) == label
        if mr != mv:
            hand_dis += 1
            hand_mr += mr == label
            hand_mv += mv == label
        rows.append(f"    {ans!r:34} {truth!r:22} equal={label!s:5} mathruler={mr!s:5} math-verify={mv!s:5}")
    print(
        f"hand-checked forms               : {len(HAND_CHECKED)} pairs, graders disagree on {hand_dis}: right mathruler {hand_mr}, "
        f"math-verify {hand_mv}; the chain (either says yes) right on {hand_chain}/{len(HAND_CHECKED)}"
    )
    print("\n".join(rows))

    # pathological answers: bounded by time limit + grace
    patho = [r"\sum_{k=1}^{1000} k^{k}", r"9^{9^{9}}", r"10^{10^{10}}", r"7^{7^{7^{7}}}"]
    extra = [f"<think>\nhm\n</think>\n<answer>\\boxed{{{a}}}</answer>" for a in patho]
    pool.max_task_seconds = 0.0
    pool.stats.clear()
    t = time.perf_counter()
    res = score_responses(
        [*responses[:256], *extra], [*truths[:256], *["3"] * len(extra)], pool, "deepscaler"
    )
    t_p = time.perf_counter() - t
    timeouts = sum(r["timeout"] for r in res)
    print(
        f"pathological: {len(extra)} answers among 256 cached ones: {t_p:.2f} s, {timeouts:.0f} timed out, "
        f"slowest {pool.max_task_seconds:.2f} s (limit {args.time_limit} s + grace {args.grace} s)"
    )
    pool.close()


if __name__ == "__main__":
    main()
