"""Rule rewards: table-driven answers people actually produce, formats, modes, cache, time limit, verl hook."""

from __future__ import annotations

import importlib.util
import signal
import time
from pathlib import Path

import pytest
from mathruler.math_normalize import normalize_answer as mr_normalize

from tools.reward.extract import check_format, extract, last_boxed
from tools.reward.grade import grade_fast, grade_full, grade_timed, plain_number
from tools.reward.pool import GradePool
from tools.reward.score import score_responses

REPO = Path(__file__).resolve().parents[3]


def wrap(answer_block: str, think: str = "Let me work it out. 1 + 1 = 2.") -> str:
    return f"<think>\n{think}\n</think>\n<answer>{answer_block}</answer>"


# (id, response, ground truth, answer correct?, strict format?)
CASES = [
    ("decimal_vs_frac", wrap(r"\boxed{0.5}"), r"\frac{1}{2}", True, True),
    ("frac_vs_decimal", wrap(r"\boxed{\frac{1}{2}}"), "0.5", True, True),
    ("frac_vs_wrong_decimal", wrap(r"\boxed{0.33}"), r"\frac13", False, True),
    ("dfrac", wrap(r"\boxed{\dfrac{1}{2}}"), r"\frac12", True, True),
    ("frac12_short", wrap(r"\boxed{\frac12}"), r"\frac{1}{2}", True, True),
    ("tfrac", wrap(r"\boxed{\tfrac{3}{4}}"), "0.75", True, True),
    ("unreduced_fraction", wrap(r"\boxed{\frac{2}{4}}"), r"\frac{1}{2}", True, True),
    ("slash_fraction", wrap(r"\boxed{3/4}"), r"\frac{3}{4}", True, True),
    ("unit_text_cm", wrap(r"\boxed{5\text{ cm}}"), "5", True, True),
    ("unit_degrees", wrap(r"\boxed{90^\circ}"), "90", True, True),
    ("unit_dollars", wrap(r"\boxed{\$18.90}"), "18.90", True, True),
    ("unit_wrong_number", wrap(r"\boxed{6\text{ cm}}"), "5", False, True),
    ("thousands_comma", wrap(r"\boxed{1,000}"), "1000", True, True),
    ("interval_spaces", wrap(r"\boxed{[2,3)}"), "[2, 3)", True, True),
    ("interval_wrong_bracket", wrap(r"\boxed{(2,3)}"), "[2,3)", False, True),
    ("interval_infinity", wrap(r"\boxed{(-\infty, 2]}"), r"(-\infty,2]", True, True),
    ("pi_same", wrap(r"\boxed{2\pi}"), r"2\pi", True, True),
    ("pi_reordered", wrap(r"\boxed{\pi \cdot 2}"), r"2\pi", True, True),
    ("pi_decimal_not_exact", wrap(r"\boxed{6.28}"), r"2\pi", False, True),
    ("negative", wrap(r"\boxed{-3}"), "-3", True, True),
    ("negative_spaced", wrap(r"\boxed{- 3}"), "-3", True, True),
    ("negative_sign_missing", wrap(r"\boxed{3}"), "-3", False, True),
    ("sqrt_nested_braces", wrap(r"\boxed{\frac{\sqrt{3}}{2}}"), r"\frac{\sqrt3}{2}", True, True),
    ("double_braces", wrap(r"\boxed{{12}}"), "12", True, True),
    ("polynomial", wrap(r"\boxed{x^2+2x+1}"), "(x+1)^2", True, True),
    ("equation_form", wrap(r"\boxed{x=3}"), "3", True, True),
    ("wrong_integer", wrap(r"\boxed{12}"), "13", False, True),
    ("several_boxed_last_wins", wrap(r"first \boxed{2}, finally \boxed{3}"), "3", True, True),
    ("several_boxed_last_wrong", wrap(r"first \boxed{3}, finally \boxed{2}"), "3", False, True),
    ("boxed_in_think_ignored", wrap(r"\boxed{4}", think=r"maybe \boxed{3}"), "3", False, True),
    ("no_boxed", wrap("3"), "3", False, False),
    ("empty_boxed", wrap(r"\boxed{}"), "3", False, False),
    ("unclosed_boxed", wrap(r"\boxed{3"), "3", False, False),
    ("text_before_tags", "Sure! " + wrap(r"\boxed{3}"), "3", True, False),
    ("text_after_tags", wrap(r"\boxed{3}") + " Hope this helps.", "3", True, False),
    ("no_tags_at_all", r"The answer is \boxed{3}.", "3", True, False),
    ("answer_after_think_no_answer_tag", r"<think>x</think> so \boxed{3}", "3", True, False),
    ("truncated_in_think", r"<think> so far \boxed{3} and then", "3", False, False),
    ("empty_think", r"<think> </think><answer>\boxed{3}</answer>", "3", True, False),
    ("two_answer_blocks", wrap(r"\boxed{2}") + wrap(r"\boxed{3}"), "3", True, False),
    ("empty_output", "", "3", False, False),
    ("whitespace_output", "  \n ", "3", False, False),
    ("very_long_output", wrap(r"\boxed{42}", think="step " * 60_000), "42", True, True),
    ("very_long_wrong", wrap(r"\boxed{41}", think=r"\frac{1}{2} " * 20_000), "42", False, True),
]


@pytest.fixture(scope="module")
def pool() -> GradePool:
    return GradePool(workers=0, time_limit=10.0)


@pytest.mark.parametrize(
    ("response", "truth", "correct", "fmt"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_answers_people_write(pool: GradePool, response: str, truth: str, correct: bool, fmt: bool) -> None:
    (acc,) = score_responses([response], [truth], pool, mode="accuracy")
    assert acc["acc"] == float(correct)
    assert acc["format"] == float(fmt)
    assert check_format(response) is fmt


@pytest.mark.parametrize(("response", "truth"), [c[1:3] for c in CASES], ids=[c[0] for c in CASES])
def test_fast_path_agrees_with_full_chain(response: str, truth: str) -> None:
    answer = extract(response).answer
    fast = grade_fast(answer, truth)
    if fast is not None:
        assert fast.correct == grade_full(answer, truth).correct


def test_fast_path_is_used_and_int_shortcut_is_exact() -> None:
    assert grade_fast("42", "42").by == "fast_equal"
    assert grade_fast(r"\dfrac{1}{2}", r"\frac{1}{2}").by == "fast_equal"
    assert grade_fast("41", "42").by == "fast_number"
    assert grade_fast("0.5", r"\frac{2}{4}").by == "fast_number"
    assert grade_fast(r"\frac{2}{4}", r"\frac12").by == "fast_number"
    assert grade_fast(r"\sqrt{12}", r"2\sqrt{3}") is None  # needs sympy
    # beyond float precision mathruler calls these equal: no shortcut may decide it differently
    big_a, big_b = "1000000000000000001", "1000000000000000000"
    assert grade_fast(big_a, big_b) is None


NUMBER_FORMS = [
    "3",
    "-3",
    "3.0",
    "0.5",
    r"\frac{1}{2}",
    r"\dfrac{2}{4}",
    r"\frac12",
    "1/2",
    "-1/2",
    "0.3333",
    r"\frac{1}{3}",
    "1000000",
    "1,000,000",
    "0.50001",
]


@pytest.mark.slow
@pytest.mark.parametrize("truth", NUMBER_FORMS)
def test_number_shortcut_equals_full_chain_on_all_pairs(truth: str) -> None:
    decided = 0
    for answer in NUMBER_FORMS:
        fast = grade_fast(answer, truth)
        if fast is not None:
            decided += 1
            assert fast.correct == grade_full(answer, truth).correct, (answer, truth, fast)
    if plain_number(mr_normalize(truth)) is not None:
        assert decided >= len(NUMBER_FORMS) // 2  # the shortcut is actually taken


EXPRESSION_FORMS = [
    r"2\sqrt{3}", r"\sqrt{12}", r"\sqrt{6}", r"3\sqrt{2}", r"\frac{\pi}{4}", r"\pi/4", r"\frac{1}{4}\pi", "0.785",
    r"\frac{\pi}{3}", "x^2 + 3x + 2", "3x + x^2 + 2", "x^2 + 3x - 2", "(x+1)(x+2)", "[2, 3)", "(2, 3)", "[2,3]",
    r"\left[2, 3\right)", "1 000", "7 3/4", r"5\text{ cm}", "x = 3", "e", r"2^{10}", "1024",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("truth", EXPRESSION_FORMS)
def test_value_shortcut_equals_full_chain_on_all_pairs(truth: str) -> None:
    for answer in EXPRESSION_FORMS:
        fast = grade_fast(answer, truth)
        if fast is not None and fast.by == "fast_value":
            assert grade_full(answer, truth).correct is False, (answer, truth)


def test_value_shortcut_is_taken_for_clear_differences() -> None:
    assert grade_fast("x^2 + 3x - 2", "x^2 + 3x + 2").by == "fast_value"
    assert grade_fast(r"\sqrt{6}", r"2\sqrt{3}").by == "fast_value"
    assert grade_fast("(2, 3)", "[2, 3)").by == "fast_value"
    assert grade_fast(r"\sqrt{12}", r"2\sqrt{3}") is None  # equal: only a grader may say yes
    # mathruler reads "1 000" as 1000 and "7 3/4" as a mixed number: the shortcut must not read 0 or 21/4
    for answer, truth in (("1 000", "1000"), ("7 3/4", "7.75")):
        v = grade_fast(answer, truth)
        assert v is None or v.correct == grade_full(answer, truth).correct


def test_mathruler_misses_unreduced_fraction_math_verify_catches_it() -> None:
    v = grade_full(r"\frac{2}{4}", r"\frac{1}{2}")
    assert v.correct and v.by == "math_verify"


def test_last_boxed_nested_and_truncated() -> None:
    assert last_boxed(r"a \boxed{\frac{1}{\sqrt{2}}} b") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed(r"\boxed{1} then \boxed{2") == "1"  # unclosed last one skipped
    assert last_boxed(r"\boxed {7}") == "7"
    assert last_boxed("nothing here") is None


def test_think_prefilled_by_prompt() -> None:
    body = r"reasoning </think> <answer>\boxed{3}</answer>"
    assert check_format(body, think_prefilled=True)
    assert not check_format(body)
    assert extract("still thinking \\boxed{3}", think_prefilled=True).answer is None


def test_modes(pool: GradePool) -> None:
    responses = [wrap(r"\boxed{3}"), wrap(r"\boxed{4}"), r"\boxed{3}", "nothing"]
    truths = ["3"] * 4
    got = {
        m: [r["score"] for r in score_responses(responses, truths, pool, m)]
        for m in ("deepscaler", "accuracy", "strict")
    }
    assert got["deepscaler"] == pytest.approx([1.0, 0.33, 0.67, 0.0])
    assert got["accuracy"] == [1.0, 0.0, 1.0, 0.0]
    assert got["strict"] == [1.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="not one of"):
        score_responses(responses, truths, pool, "nope")


def test_several_ground_truths_any_matches(pool: GradePool) -> None:
    (r,) = score_responses([wrap(r"\boxed{4}")], [["3", "4"]], pool, "accuracy")
    assert r["acc"] == 1.0


def test_cache_reuses_verdicts() -> None:
    pool = GradePool(workers=0)
    pairs = [(r"\sqrt{12}", r"2\sqrt{3}"), ("x+2", "x+1"), (r"\sqrt{12}", r"2\sqrt{3}")]
    first = pool.grade(pairs)
    assert pool.stats["duplicate"] == 1 and pool.stats["cache"] == 0
    second = pool.grade(pairs)
    assert second == first
    assert pool.stats["cache"] == 3
    assert [v.correct for v in first] == [True, False, True]


@pytest.mark.slow
def test_worker_pool_matches_in_process_and_bounds_hangs() -> None:
    pairs = [(c, t) for _, r, t, _, _ in CASES[:12] for c in [extract(r).answer]]
    soft = (r"10^{10^{10}}", "1")  # sympy works on it for minutes: stopped by the worker's own alarm
    hard = ("HANG", "1")  # tests/hanging_worker.py blocks the alarm, as C code would: only a kill helps
    with GradePool(
        workers=2,
        time_limit=0.5,
        grace=0.5,
        use_fast_path=False,
        worker_module=str(REPO / "tests/hanging_worker.py"),
    ) as pool:
        pool.start()
        first = list(pool._pool)
        t = time.perf_counter()
        got = pool.grade([*pairs, soft, hard])
        elapsed = time.perf_counter() - t
        assert [(v.correct, v.by) for v in got[-2:]] == [(False, "timeout"), (False, "timeout")]
        assert [v.correct for v in got[:-2]] == [grade_full(a, g).correct for a, g in pairs]
        assert (
            pool.max_task_seconds < 0.5 + 0.5 + 4.0
        )  # limit + grace, with room for a loaded machine; a hang is forever
        assert elapsed < 30
        replaced = [w for w in first if w not in pool._pool]
        assert len(replaced) == 1 and replaced[0].exited()  # the hung worker was killed
        # and its replacement grades
        assert pool.grade([("1/2", "0.25"), (r"\sqrt{8}", r"2\sqrt{2}")])[1].correct is True


def test_worker_pool_is_safe_from_several_threads() -> None:
    """verl 0.9.1's reward loop calls the reward function from a thread pool, against the one pool per
    process of verl_reward.py: calls from several threads must each get their own verdicts, and return.
    Unlocked, two threads shared the worker's socket: one read the other's answer, the other waited for
    it forever (a current-stack tiny-learn run stalled at step 4 that way)."""
    import threading

    calls, per_thread = 4, 15
    errors: list[str] = []
    with GradePool(workers=1, time_limit=5.0, use_fast_path=False, cache_size=0) as pool:
        pool.start()

        def work(t: int) -> None:
            for i in range(per_thread):
                n = 100 * t + i
                truth = str(n if i % 2 == 0 else n + 1)  # right, then wrong: a swapped verdict shows
                try:
                    (v,) = pool.grade([(str(n), truth)])
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(f"thread {t} call {i}: {e!r}")
                    return
                if v.correct != (i % 2 == 0):
                    errors.append(f"thread {t} call {i}: ({n}, {truth}) graded {v}")

        threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(calls)]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 60
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        stuck = [th.name for th in threads if th.is_alive()]
    assert not stuck, f"{len(stuck)} grading calls never returned (a shared worker socket)"
    assert not errors, errors[:5]


def load_like_verl(name: str):
    """Import tools/reward/verl_reward.py by path, as verl's get_custom_reward_fn does."""
    spec = importlib.util.spec_from_file_location("custom_module_test", REPO / "tools/reward/verl_reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def test_verl_entry_points_by_path() -> None:
    fn = load_like_verl("compute_score")
    out = fn(
        data_source="deepscaler",
        solution_str=wrap(r"\boxed{0.5}"),
        ground_truth=r"\frac12",
        extra_info={"index": 0},
        workers=0,
    )
    assert out == {"score": 1.0, "acc": 1.0, "format": 1.0, "timeout": 0.0, "pred": "1/2"}
    acc = load_like_verl("compute_score_accuracy")
    assert acc("x", r"\boxed{2}", "2", None, workers=0)["score"] == 1.0
    strict = load_like_verl("compute_score_strict")
    assert strict("x", r"\boxed{2}", "2", None, workers=0)["score"] == 0.0
    batch = load_like_verl("compute_score_batch")
    scores = batch(
        data_sources=["a", "a"],
        solution_strs=[wrap(r"\boxed{1}"), ""],
        ground_truths=["1", "1"],
        extra_infos=[{}, {}],
        workers=0,
    )
    assert [s["score"] for s in scores] == [1.0, 0.0]
    assert [s["pred"] for s in scores] == ["1", ""]  # no answer votes "" (tools/reward/vote.py)


def test_in_process_limit_stops_slow_sympy_even_through_grader_excepts() -> None:
    slow = (r"\sum_{k=1}^{1000} k^{k}", "1")  # math-verify evaluates the sum: seconds of pure Python
    pool = GradePool(workers=0, time_limit=0.5)
    t = time.perf_counter()
    (v,) = pool.grade([slow])
    assert v.by == "timeout" and not v.correct
    assert (
        time.perf_counter() - t < 10.0
    )  # unbounded, this sum runs for minutes; generous for a loaded CI box
    assert pool.grade([("3", "3")])[0].correct  # the alarm is off again
    for _ in range(3):  # repeated timeouts leave no timer or handler behind
        assert grade_timed(*slow, 0.1).by == "timeout"
    time.sleep(0.2)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


# ---- bounded reward time -----------------------------------------------------------------------------


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_answers_stuck_in_c_code_are_each_cut_at_the_limit_asked(pidfd: bool, monkeypatch) -> None:
    """16 distinct answers that ignore the alarm (as code stuck in C does), 2 workers: each is cut at
    time_limit + grace and its worker replaced by a fork of the warm zygote in milliseconds. Before, each
    replacement was a fresh interpreter importing sympy (2-3 s, ~10 s on a loaded machine) while that
    worker graded nothing: the same batch with a 1 s limit took 45.8 s (213 s beside a make train)."""
    if not pidfd:  # a kernel without pidfds (Linux < 5.3): workers are signalled by pid

        def no_pidfd(pid: int) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr("os.pidfd_open", no_pidfd)
    limit, grace = 0.3, 0.2
    hung = [(f"HANG{i}", "1") for i in range(16)]
    with GradePool(
        workers=2,
        time_limit=limit,
        grace=grace,
        cache_size=0,
        worker_module=str(REPO / "tests/hanging_worker.py"),
    ) as pool:
        pool.start()
        assert all((w.pidfd is not None) == pidfd for w in pool._pool)
        t = time.perf_counter()
        got = pool.grade(hung)
        elapsed = time.perf_counter() - t
        assert {(v.correct, v.by) for v in got} == {(False, "timeout")}
        assert pool.max_task_seconds < limit + grace + 1.0
        # 8 rounds of (limit + grace) = 4 s; a fresh interpreter per replacement would add >= 8 x 2 s
        assert elapsed < 8 * (limit + grace) + 4.0, f"16 stuck answers took {elapsed:.1f} s"
        assert pool.grade([(r"\sqrt{8}", r"2\sqrt{2}")])[0].correct is True  # the replacements grade


def test_a_batch_deadline_bounds_one_call_whatever_the_answers() -> None:
    hung = [(f"HANG{i}", "1") for i in range(8)]
    with GradePool(
        workers=1,
        time_limit=5.0,
        batch_time_limit=1.0,
        cache_size=0,
        worker_module=str(REPO / "tests/hanging_worker.py"),
    ) as pool:
        pool.start()
        t = time.perf_counter()
        got = pool.grade([*hung, ("2", "2")])
        elapsed = time.perf_counter() - t
        assert elapsed < 1.0 + 1.5, f"the batch took {elapsed:.1f} s, its deadline is 1 s"
        assert [v.by for v in got[:-1]] == ["deadline"] * 8 and not any(v.correct for v in got[:-1])
        assert got[-1].correct  # settled by the fast path before the deadline
        assert pool.grade([("1/2", "0.5")])[0].correct  # the pool goes on after a cut


def test_a_step_deadline_bounds_answers_graded_one_call_each() -> None:
    """verl's per-response managers call the reward function once per response, from a thread pool: 12
    answers stuck in C code, a 1 s limit each, are 12+ s of grading in one step. With step_time_limit 1.5
    the step's calls together stop at 1.5 s; after an idle pause longer than step_gap the next step has
    its whole budget again, while a call right after the cut is cut at once."""
    from concurrent.futures import ThreadPoolExecutor

    hung = [(f"HANG{i}", "1") for i in range(12)]
    with GradePool(
        workers=1,
        time_limit=1.0,
        grace=0.2,
        step_time_limit=1.5,
        step_gap=0.5,
        cache_size=0,
        worker_module=str(REPO / "tests/hanging_worker.py"),
    ) as pool:
        pool.start()
        t = time.perf_counter()
        with ThreadPoolExecutor(8) as threads:  # as verl's run_in_executor does
            got = [v for [v] in threads.map(lambda pair: pool.grade([pair]), hung)]
        elapsed = time.perf_counter() - t
        assert elapsed < 1.5 + 1.5, f"one step's 12 calls took {elapsed:.1f} s, its deadline is 1.5 s"
        assert not any(v.correct for v in got)
        assert {v.by for v in got} <= {"timeout", "deadline"} and "deadline" in {v.by for v in got}
        slow_but_right = (r"\sqrt{8}", r"2\sqrt{2}")  # the fast path cannot settle it: a worker grades it
        assert pool.grade([slow_but_right])[0].by == "deadline"  # the same step: its budget is spent
        time.sleep(0.8)  # the actor's update: the pool idles for longer than step_gap
        assert pool.grade([slow_but_right])[0].correct  # a new step, with the whole budget


def test_the_step_deadline_in_the_scores_of_compute_score() -> None:
    fn = load_like_verl("compute_score")
    slow = [rf"\sum_{{k=1}}^{{{2000 + i}}} k^{{k}}" for i in range(6)]  # seconds of sympy each
    t = time.perf_counter()
    out = [
        fn(
            "s",
            rf"<think>x</think> <answer>\boxed{{{a}}}</answer>",
            "1",
            None,
            time_limit=10.0,
            step_time_limit=1.0,
        )
        for a in slow
    ]
    assert time.perf_counter() - t < 1.0 + 3.0
    assert [r["timeout"] for r in out] == [1.0] * 6 and [r["acc"] for r in out] == [0.0] * 6


def test_the_batch_deadline_in_process_and_in_the_scores() -> None:
    slow = [(rf"\sum_{{k=1}}^{{{1000 + i}}} k^{{k}}", "1") for i in range(6)]  # seconds of sympy each
    pool = GradePool(workers=0, time_limit=10.0, batch_time_limit=0.5, cache_size=0)
    t = time.perf_counter()
    got = pool.grade(slow)
    assert time.perf_counter() - t < 2.0
    assert {v.by for v in got} == {"deadline"}
    fn = load_like_verl("compute_score_batch")
    responses = [rf"<think>x</think> <answer>\boxed{{{a}}}</answer>" for a, _ in slow]
    out = fn(["s"] * 6, responses, ["1"] * 6, None, workers=0, time_limit=10.0, batch_time_limit=0.5)
    assert [r["timeout"] for r in out] == [1.0] * 6 and [r["acc"] for r in out] == [0.0] * 6
