"""pass@k: the chance that at least one of k responses drawn without replacement from a problem's n is right.

The unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1):
with n responses of which c are right, pass@k = 1 - C(n-c, k) / C(n, k), averaged over the problems. The
binomials overflow a float for n in the hundreds; the product form below does not:

    C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k of one problem with `n` responses, `c` of them right (0 <= c <= n, 1 <= k <= n)."""
    if not 0 <= c <= n:
        raise ValueError(f"c={c} right responses out of n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} outside 1..n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def ks_up_to(k_max: int) -> list[int]:
    """1, 2, 4, ... up to k_max, and k_max itself (the k's a summary reports: 1, 2, 4, 8, 16 for K=16)."""
    if k_max < 1:
        raise ValueError(f"k_max={k_max} < 1")
    ks = [1]
    while ks[-1] * 2 <= k_max:
        ks.append(ks[-1] * 2)
    if ks[-1] != k_max:
        ks.append(k_max)
    return ks


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k over problems: the mean of each problem's estimate; `counts` holds (n, c) per problem."""
    if not counts:
        raise ValueError("no problems")
    return float(np.mean([pass_at_k(n, c, k) for n, c in counts]))
