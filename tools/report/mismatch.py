"""Rollout vs actor mismatch: which of three causes it is, and the steps whose worst token passes the bound.

verl 0.9.1 logs, for rollouts that return their token log-probs (`rollout.calculate_log_probs`), the
per-step mean and max of |p_rollout - p_actor| over the response tokens (`training/rollout_probs_diff_mean`,
`_max`). Where the run also logs the routing disagreement (`rollout/routing_disagreement` and the split of
the mismatch `rollout/mismatch_routing_share`, tools/routing/disagreement.step_metrics) the report can say
which of the three it is:

- **a weight hand-over fault**: the engine samples from weights other than the actor's, so the mismatch is
  on every token: the step's MEAN is at or above HANDOVER_MEAN (5e-3, the tolerance of the project's
  hand-over check, tests/train_e2e.py check_rollout_follows_actor; the miniatures' healthy means are below it
  at every step of their CI runs);
- **routing**: an MoE model's two routers picked different experts for the tokens that carry the mismatch
  (over the flagged steps, tokens routed differently carry at least half of the summed difference);
- **precision**: the same experts (or a dense model), other kernels and precisions: the rest.

A step is flagged when its worst token (`training/rollout_probs_diff_max`) passes the recipe's
`launch.health.mismatch_bound` (recipes/algorithm/grpo-r1-zero.yaml, 0.1 by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tools.report.runs import Run, get

MEAN, MAX = "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max"
DISAGREEMENT, ROUTING_SHARE = "rollout/routing_disagreement", "rollout/mismatch_routing_share"
ROUTED_MOST = 0.5  # a flagged step is routing's where the tokens routed differently carry this share or more
HANDOVER_MEAN = 5e-3
DEFAULT_BOUND = 0.1


def bound_of(config: Any) -> float:
    """The run's `launch.health.mismatch_bound` (DEFAULT_BOUND where the run's config has none)."""
    from omegaconf import OmegaConf  # only where a run has a config to read

    value = None if config is None else OmegaConf.select(config, "launch.health.mismatch_bound", default=None)
    return DEFAULT_BOUND if value is None else float(value)


def _is_moe(config: Any) -> bool | None:
    if config is None:
        return None
    from omegaconf import OmegaConf

    experts = OmegaConf.select(config, "launch.model_config.n_routed_experts", default=None)
    return None if experts is None else int(experts) > 0


def _replayed(config: Any) -> bool:
    """Whether the run replayed the rollout's routes in the actor (R3)."""
    if config is None:
        return False
    from omegaconf import OmegaConf

    return (
        OmegaConf.select(config, "verl.actor_rollout_ref.actor.megatron.router_replay.mode", default=None)
        == "R3"
    )


def _steps(run: Run, key: str) -> dict[int, float]:
    return {s: float(v) for s, m in run.steps.items() if (v := get(m, key)) is not None}


def _listed(steps: list[int], n: int = 12) -> str:
    shown = ", ".join(str(s) for s in steps[:n])
    return shown + (f" and {len(steps) - n} more" if len(steps) > n else "")


@dataclass
class Verdict:
    cause: str  # "not measured" | "within the bound" | "hand-over fault" | "routing" | "precision"
    #              | "precision and routing" | "routing or precision" (not told apart)
    line: str  # one line for the report's health section and the terminal
    bound: float
    flagged: list[int] = field(default_factory=list)  # steps whose worst token passed the bound

    @property
    def worth_saying(self) -> bool:
        """Whether `make train`'s end lines carry it (a flag or a fault; silence when all is well)."""
        return bool(self.flagged) or self.cause == "hand-over fault"


def verdict(run: Run) -> Verdict:
    bound = bound_of(run.config)
    worst, mean = _steps(run, MAX), _steps(run, MEAN)
    if not worst and not mean:
        return Verdict("not measured", "rollout vs actor mismatch not measured: verl logs it only where the "
                       "rollout returns its token log-probs (rollout.calculate_log_probs)", bound)  # fmt: skip
    flagged = sorted(s for s, v in worst.items() if v > bound)
    spread = [s for s, v in mean.items() if v >= HANDOVER_MEAN]
    if spread:
        top = max(spread, key=lambda s: mean[s])
        return Verdict(
            "hand-over fault",
            f"mismatch: a weight hand-over fault is likely: the mean |p_rollout - p_actor| is >= {HANDOVER_MEAN:g} "
            f"at {len(spread)} of {len(mean)} steps ({_listed(sorted(spread))}; {mean[top]:.3g} at step {top}): "
            "the mismatch is on every token, as when the engine samples from weights other than the actor's "
            "(routing and precision move a few tokens)",
            bound,
            flagged,
        )
    if not flagged:
        top = max(worst, key=lambda s: worst[s]) if worst else None
        largest = f"; the largest {worst[top]:.3g} at step {top}" if top is not None else ""
        return Verdict("within the bound", f"mismatch within the bound: the worst token's |p_rollout - p_actor| "
                       f"is <= {bound:g} at every step{largest}", bound)  # fmt: skip
    flag = (
        f"{len(flagged)} of {len(worst)} steps have a token above the bound {bound:g} "
        f"(launch.health.mismatch_bound): steps {_listed(flagged)}"
    )
    shares = _steps(run, ROUTING_SHARE)
    measured = [s for s in flagged if s in shares]  # flagged steps that logged the routing split
    if measured:
        share = sum(shares[s] for s in measured) / len(measured)
        dis = _steps(run, DISAGREEMENT)
        rate = sum(dis[s] for s in flagged if s in dis) / max(1, sum(1 for s in flagged if s in dis))
        if _replayed(run.config):  # the actor scored every token with the rollout's experts
            why = (
                f"routing replay (R3) gave the actor the rollout's experts, so the rest is kernels; the "
                f"{rate:.2%} of tokens its own router would have sent elsewhere carry {share:.0%} of it"
            )
            return Verdict("precision", f"mismatch: precision: {flag}; {why}", bound, flagged)
        # per flagged step: routing where the tokens routed differently carry most of its summed difference
        by_routing = [s for s in measured if shares[s] >= ROUTED_MOST]
        cause = (
            "routing"
            if len(by_routing) * 2 > len(measured)
            else "precision and routing"
            if by_routing
            else "precision"
        )
        top = max(flagged, key=lambda s: worst[s])
        why = (
            f"tokens routed differently carry {share:.0%} of the difference at those steps on average "
            f"({rate:.2%} of tokens routed differently, {DISAGREEMENT})"
        )
        if cause == "precision and routing":
            why += (
                f"; most of it at {len(by_routing)} of them (steps {_listed(by_routing)}), "
                + ("among them the largest" if top in by_routing else "not the largest")
                + f" ({worst[top]:.3g} at step {top}); the same-route tokens carry the rest"
            )
        return Verdict(cause, f"mismatch: {cause}: {flag}; {why}", bound, flagged)
    if _is_moe(run.config) is False:
        return Verdict(
            "precision", f"mismatch: precision (a dense model routes nothing): {flag}", bound, flagged
        )
    return Verdict(
        "routing or precision",
        f"mismatch: routing or precision, not told apart: {flag}; the run logged no {DISAGREEMENT} "
        "(the routing disagreement needs the rollout's routed experts: docs/routing-replay.md); the mean stays "
        f"below {HANDOVER_MEAN:g} at every step, so not a weight hand-over fault",
        bound,
        flagged,
    )


CORR = (
    "rollout_corr/log_ppl_diff_max",
    "rollout_corr/training_ppl",
    "rollout_corr/rollout_ppl",
    "rollout_corr/kl",
)


def sequence_line(run: Run) -> str | None:
    """verl's sequence-level view of the mismatch (`rollout_corr/*`, verl 0.9.1's off-policy metrics, logged
    where the rollout returns its log-probs) at the step whose worst token is the largest: a sequence's
    log-perplexity, actor minus rollout, at its largest; the batch's perplexity under each; and the KL
    estimate E[log p_rollout - log p_actor]. None where the run logged none of them."""
    worst = _steps(run, MAX)
    logged = [s for s in run.steps if any(get(run.steps[s], k) is not None for k in CORR)]
    if not logged:
        return None
    step = max(worst, key=lambda s: worst[s]) if worst else logged[-1]
    m = run.steps[step]
    parts = [f"{k.split('/', 1)[1]} {v:.3g}" for k in CORR if (v := get(m, k)) is not None]
    if not parts:
        return None
    at = f"at step {step} (its worst token {worst[step]:.3g})" if step in worst else f"at step {step}"
    return f"rollout_corr/* {at}: " + ", ".join(parts)
