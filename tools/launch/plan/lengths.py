"""Response lengths for the step-time model: a truncated exponential (the mean as given, capped at
data.max_response_length). RL responses have a long right tail and many hit the cap. The law gives the
expected longest response of a wave (the decode steps the wave takes) and the mean square length
(attention and KV-cache reads grow with it)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Lengths:
    """Prompt mean, response mean and cap; the response law is Exp(mu) truncated at the cap."""

    prompt: float
    response: float
    response_max: int
    mu: float = 0.0

    @classmethod
    def of(cls, prompt: float, response: float, response_max: int) -> Lengths:
        if not 0 < response <= response_max:
            raise ValueError(f"expected response {response} is not in (0, {response_max}]")
        return cls(prompt, response, response_max, _solve_mu(response, response_max))

    @property
    def capped(self) -> bool:
        return math.isinf(self.mu)

    def response_sq(self) -> float:
        """E[R^2] of the truncated law: E[min(X, m)^2] = 2 mu^2 (1 - e^-m/mu (1 + m/mu))."""
        m, mu = self.response_max, self.mu
        if self.capped:
            return float(m * m)
        x = m / mu
        return 2 * mu * mu * (1 - math.exp(-x) * (1 + x))

    def longest_of(self, n: int) -> float:
        """E[min(max of n responses, cap)] = integral_0^cap 1 - (1 - e^-x/mu)^n dx (midpoint rule)."""
        if self.capped or n <= 0:
            return float(self.response_max)
        return _longest(self.mu, self.response_max, n)

    def seq_sq(self) -> float:
        """E[(prompt + response)^2]."""
        return self.prompt**2 + 2 * self.prompt * self.response + self.response_sq()


@functools.lru_cache(maxsize=4096)
def _longest(mu: float, cap: int, n: int) -> float:
    steps = 256
    h = cap / steps
    return sum(1 - (1 - math.exp(-(k + 0.5) * h / mu)) ** n for k in range(steps)) * h


def _solve_mu(mean: float, cap: float) -> float:
    """mu with E[min(Exp(mu), cap)] = mu (1 - e^-cap/mu) = mean; inf when the mean is (almost) the cap."""
    if mean >= cap * 0.999:
        return math.inf
    lo, hi = 1e-9, cap
    while hi * (1 - math.exp(-cap / hi)) < mean:
        hi *= 2
        if hi > cap * 1e6:
            return math.inf
    for _ in range(100):
        mid = (lo + hi) / 2
        if mid * (1 - math.exp(-cap / mid)) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
