"""Response lengths for the step-time model. A synchronous rollout decodes until a wave's last sequence
ends, so what a wave costs is set by its longest response (the batch thinning as sequences finish only
changes the KV-cache reads). Two laws:

  from the mean      a truncated exponential (the mean as given, capped at data.max_response_length); the
                     share it puts at the cap follows from the mean
  with a clip ratio  launch.expect.response_clip_ratio, the share of responses that hit the cap (verl logs
                     it as response_length/clip_ratio): that share sits at the cap, the rest follows a
                     truncated exponential with the remaining mean; a wave of n sequences then reaches the
                     cap with probability 1 - (1 - clip)^n

Either gives the expected longest response of a wave (the decode steps the wave takes) and the mean
square length (attention and KV-cache reads grow with it)."""

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
    clip: float | None = None  # the share of responses at the cap, when given
    rest: float = 0.0  # with clip: the mean of the responses below the cap

    @classmethod
    def of(cls, prompt: float, response: float, response_max: int, clip: float | None = None) -> Lengths:
        if not 0 < response <= response_max:
            raise ValueError(f"expected response {response} is not in (0, {response_max}]")
        if clip is None:
            return cls(prompt, response, response_max, _solve_mu(response, response_max))
        if not 0 <= clip <= 1 or clip * response_max > response or (clip < 1 and response >= response_max):
            raise ValueError(
                f"clip ratio {clip} does not fit the mean response {response} of cap {response_max} "
                "(clip x cap must not exceed the mean)"
            )
        rest = (response - clip * response_max) / (1 - clip) if clip < 1 else float(response_max)
        rest = min(max(rest, 1e-6), response_max * 0.998)
        return cls(prompt, response, response_max, _solve_mu(rest, response_max), clip, rest)

    @property
    def law(self) -> str:
        if self.clip is not None:
            return f"{self.clip:.1%} of the responses at the cap (clip ratio), the rest exponential"
        return "truncated exponential from the mean"

    @property
    def capped(self) -> bool:
        return math.isinf(self.mu)

    def response_sq(self) -> float:
        """E[R^2] of the truncated law: E[min(X, m)^2] = 2 mu^2 (1 - e^-m/mu (1 + m/mu)); with a clip
        ratio, the clipped share at m^2 and the rest by the same formula."""
        m, mu = self.response_max, self.mu
        if math.isinf(mu):
            base = float(m * m)
        else:
            x = m / mu
            base = 2 * mu * mu * (1 - math.exp(-x) * (1 + x))
        if self.clip is None:
            return base
        return self.clip * m * m + (1 - self.clip) * base

    def longest_of(self, n: int) -> float:
        """E[min(max of n responses, cap)] = integral_0^cap 1 - (1 - e^-x/mu)^n dx (midpoint rule); with a
        clip ratio c, the cap with probability 1 - (1 - c)^n, else the longest of the rest."""
        if n <= 0 or math.isinf(self.mu):
            return float(self.response_max)
        base = _longest(self.mu, self.response_max, n)
        if self.clip is None:
            return base
        hit = 1 - (1 - self.clip) ** n
        return hit * self.response_max + (1 - hit) * base

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
