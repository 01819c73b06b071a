"""Equivalent (and a few wrong) forms of real MATH-500 answers, with the verdict a person gives.

Each entry is (MATH-500 unique_id, a response's answer, correct?): the gold is the file's answer for that
id (benchmarks/math500/test.jsonl), so the table follows the shipped data. Used by the grader's tests
(tests/tools/reward/test_benchmark_answers.py) and by bench/grader_vs_math_verify.py, which lists where
the project's grader and math-verify disagree (docs/evaluation.md).
"""

from __future__ import annotations

# (unique_id, answer as a model might box it, what a person says)
EQUIVALENTS: list[tuple[str, str, bool]] = [
    # fractions: \frac, \dfrac, \tfrac, a/b, decimals, unreduced
    ("test/algebra/2584.json", r"\dfrac{14}{3}", True),
    ("test/algebra/2584.json", "14/3", True),
    ("test/algebra/2584.json", r"\frac{28}{6}", True),
    ("test/algebra/2584.json", "4.67", False),
    ("test/prealgebra/1655.json", r"\frac{17}{50}", True),
    ("test/prealgebra/1655.json", "0.34", True),
    ("test/prealgebra/1655.json", "17/50", True),
    ("test/prealgebra/1742.json", "0.33", True),
    ("test/prealgebra/1742.json", r"\tfrac{33}{100}", True),
    ("test/prealgebra/1742.json", r"\frac{1}{3}", False),
    # \boxed content with spaces and \left( \right)
    ("test/precalculus/807.json", r"(3, \frac{\pi}{2})", True),
    ("test/precalculus/807.json", r"(3,\pi/2)", True),
    ("test/precalculus/807.json", r"\left(3,\dfrac{\pi}{2}\right)", True),
    ("test/precalculus/807.json", r"(3, \pi)", False),
    ("test/precalculus/541.json", r"(1.5, -13)", True),
    ("test/precalculus/541.json", r"\left(\frac32,-13\right)", True),
    # intervals and unions
    ("test/intermediate_algebra/558.json", "(3, 4]", True),
    ("test/intermediate_algebra/558.json", "[3,4]", False),
    ("test/intermediate_algebra/183.json", r"(2, \infty)", True),
    (
        "test/intermediate_algebra/183.json",
        r"x > 2",
        False,
    ),  # asked for interval notation: both graders say no
    ("test/algebra/2486.json", r"(\frac{3}{5}, \frac{8}{3}]", True),
    ("test/algebra/2486.json", r"(0.6, \frac{8}{3}]", True),
    ("test/algebra/2043.json", r"(-\infty,2)\cup(3,\infty)", True),
    ("test/algebra/2043.json", r"(3,\infty)\cup(-\infty,2)", True),
    ("test/algebra/101.json", "[-2,7]", True),
    ("test/algebra/101.json", "[-2,7)", False),
    # \text{} answers, names and multiple-choice letters
    ("test/algebra/1349.json", "Evelyn", True),
    ("test/algebra/1349.json", r"\text{Evelyn}", True),
    ("test/algebra/1349.json", r"\text{Carla}", False),
    ("test/precalculus/819.json", "C", True),
    ("test/precalculus/819.json", "(C)", True),
    ("test/precalculus/819.json", r"\text{C}", True),
    ("test/precalculus/819.json", r"\text{(B)}", False),
    ("test/intermediate_algebra/860.json", "ellipse", True),
    ("test/intermediate_algebra/860.json", r"\text{(ellipse)}", True),
    # units and degrees
    ("test/precalculus/927.json", "90", True),
    ("test/precalculus/927.json", r"90^{\circ}", True),
    ("test/precalculus/927.json", r"90\text{ degrees}", True),
    ("test/precalculus/927.json", r"\frac{\pi}{2}", False),
    ("test/prealgebra/1003.json", r"\frac{270}{7}", True),
    ("test/prealgebra/1003.json", r"\frac{270}{7}^\circ", True),
    ("test/prealgebra/1044.json", "5.4", True),
    ("test/prealgebra/1044.json", r"5.4\text{ cents}", True),
    ("test/geometry/473.json", "864", True),
    ("test/geometry/473.json", r"864\text{ square inches}", True),
    (
        "test/geometry/473.json",
        "864 inches^2",
        True,
    ),  # mathruler and math-verify both miss it: grade.py's unit rule
    ("test/prealgebra/1114.json", "15 cm^2", True),
    ("test/prealgebra/1114.json", r"15\text{ cm}^2", True),
    ("test/prealgebra/1114.json", "16 cm^2", False),
    ("test/prealgebra/1114.json", "15 m^2", False),
    ("test/geometry/1108.json", "(2,4)", True),
    ("test/algebra/2626.json", "32348", True),
    ("test/algebra/2626.json", r"\$32,348", True),
    ("test/algebra/2626.json", "32,348", True),
    # thousands separators
    ("test/counting_and_probability/508.json", "10080", True),
    ("test/counting_and_probability/508.json", "10,080", True),
    ("test/number_theory/417.json", "11111111100", True),
    ("test/counting_and_probability/737.json", "58500", True),
    # square roots and pi
    ("test/algebra/2036.json", r"3\,\sqrt{13}", True),
    ("test/algebra/2036.json", r"3\sqrt13", False),  # TeX reads \sqrt13 as \sqrt{1}3: 9, as both graders do
    ("test/algebra/2036.json", r"\sqrt{117}", True),
    ("test/algebra/2036.json", r"3 \cdot \sqrt{13}", True),
    ("test/algebra/2036.json", r"\sqrt{13}", False),
    ("test/algebra/2253.json", r"\frac{3}{4}\sqrt{3}", True),
    ("test/algebra/2253.json", r"\dfrac{3\sqrt3}{4}", True),
    ("test/algebra/1519.json", r"\frac{1}{\sqrt{3}}", True),
    ("test/precalculus/1056.json", r"288\pi", True),
    ("test/precalculus/1056.json", r"\pi \cdot 288", True),
    ("test/precalculus/1056.json", "904.78", False),
    ("test/intermediate_algebra/662.json", r"1+\sqrt{19}, 1-\sqrt{19}", True),
    # complex numbers, lists, tuples, matrices, polynomials
    ("test/precalculus/990.json", "6-5i", True),
    ("test/precalculus/990.json", "-5i+6", True),
    ("test/intermediate_algebra/428.json", "3,5,7", True),
    ("test/intermediate_algebra/428.json", "7, 5, 3", True),
    ("test/intermediate_algebra/1388.json", "-2, 1", True),
    ("test/intermediate_algebra/956.json", "(6, 31, -1)", True),
    ("test/intermediate_algebra/956.json", "(6, -1, 31)", False),
    ("test/precalculus/263.json", r"\begin{pmatrix}-2\\-14\\-7\end{pmatrix}", True),
    ("test/precalculus/1300.json", r"\begin{pmatrix} -\frac13 \\ \frac23 \\ \frac53 \end{pmatrix}", True),
    ("test/algebra/2046.json", "x^3 + 3x - 6", True),
    ("test/algebra/2046.json", "3x+x^3-6", True),
    ("test/intermediate_algebra/431.json", "(b+2)(a+5)", True),
    ("test/intermediate_algebra/431.json", "ab+2a+5b+10", True),
    # negatives, plain integers with leading zeros or a trailing .0, equations
    ("test/intermediate_algebra/134.json", "-50", True),
    ("test/intermediate_algebra/134.json", "50", False),
    ("test/intermediate_algebra/1994.json", "-q + p", True),
    ("test/intermediate_algebra/1994.json", "q - p", False),
    ("test/prealgebra/1622.json", "42.0", True),
    ("test/prealgebra/1622.json", "042", True),
    ("test/prealgebra/1622.json", "x = 42", True),
]
