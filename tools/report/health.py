"""Health curves and the reward split: which of verl's metrics each plot draws, how to read it, and why it
is absent when verl did not log it for the run's recipe (the page says so instead of drawing an empty
axis). Every series is read under verl's own metric name, and the page cites that name.

Names as verl logs them (verl 0.6.0 and 0.9.1 alike unless said):
    actor/kl_loss, actor/kl_coef           the KL-to-reference loss term (actor.use_kl_loss) and its weight
    actor/reward_kl_penalty                the KL penalty in the reward (algorithm.use_kl_in_reward)
    actor/entropy                          mean token entropy of the responses under the actor
    actor/grad_norm                        gradient norm of the actor's update (before clipping)
    actor/pg_clipfrac, actor/pg_clipfrac_lower   fraction of tokens where the PPO ratio was clipped
    training/rollout_probs_diff_mean, _max, _std, training/rollout_actor_probs_pearson_corr
                                           |p_rollout - p_actor| per token (verl 0.9.1, rollouts that
                                           return their log-probs: the hand-over's health signal)
    critic/advantages/mean, /max, /min     GRPO's group-normalised advantages
    response_length/clip_ratio             fraction of responses that hit max_response_length
    prompt_length/clip_ratio, response/aborted_ratio
    critic/score/mean                      the reward function's score (critic/rewards/mean adds in-reward KL)
    reward/format, reward/accuracy, reward/timeouts   tools/reward/tally.py (verl logs no training split)
    val-aux/<data>/format/mean@<n>, val-core/<data>/acc/mean@<n>, val-aux/<data>/timeout/mean@<n>
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tools.records import validation_key
from tools.report import mismatch
from tools.report.runs import Run, get


@dataclass(frozen=True)
class Series:
    key: str  # verl's metric name
    label: str


@dataclass(frozen=True)
class Panel:
    name: str  # the PNG's file name
    title: str
    ylabel: str
    series: tuple[Series, ...]
    read: str  # how to read it (one sentence for the page)
    absent: Callable[[Any], str]  # config.yaml (or None) -> why verl logged none of the series


def _sel(cfg: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    return None if cfg is None else OmegaConf.select(cfg, key, default=None)


def _generic(cfg: Any) -> str:
    return "verl logged none of these metrics in this run"


def _kl_absent(cfg: Any) -> str:
    loss = _sel(cfg, "verl.actor_rollout_ref.actor.use_kl_loss")
    in_reward = _sel(cfg, "verl.algorithm.use_kl_in_reward")
    if loss is False and not in_reward:
        return (
            "no KL: the recipe has no KL term to a reference model (actor_rollout_ref.actor.use_kl_loss=false, "
            "algorithm.use_kl_in_reward=false), so verl computes none"
        )
    return _generic(cfg)


def _probs_absent(cfg: Any) -> str:
    rollout = _sel(cfg, "verl.actor_rollout_ref.rollout.name")
    return (
        "verl logs the rollout-vs-actor probability difference (verl 0.9.1) only when the rollout returns "
        f"its token log-probs and the old log-probs are recomputed; this run's rollout ({rollout or 'unknown'}"
        f"{', verl ' + str(_sel(cfg, 'launch.verl_version')) if _sel(cfg, 'launch.verl_version') else ''}) "
        "returned none"
    )


def _routing_absent(cfg: Any) -> str:
    if not _sel(cfg, "launch.model_config.n_routed_experts"):
        return "a dense model: no routing to compare"
    if _sel(cfg, "launch.stack") == "published":
        return "not measurable on the published stack (verl 0.6.0 has no router replay to record with)"
    if _sel(cfg, "verl.actor_rollout_ref.actor.megatron.router_replay.measure"):
        return (
            "measured (router_replay.measure), yet verl logged none: the old log-probs were not recomputed "
            "(bypass mode) or the rollout returned no routed experts"
        )
    return (
        "not measured in this run: launch.measure_routing was off (ARGS='launch.measure_routing=true' measures "
        "it; docs/routing-replay.md)"
    )


HEALTH: tuple[Panel, ...] = (
    Panel("kl.png", "KL to the reference", "KL",
          (Series("actor/kl_loss", "kl_loss"), Series("actor/reward_kl_penalty", "reward_kl_penalty")),
          "How far the actor has moved from the reference model; a steady climb is expected, a jump is not.",
          _kl_absent),
    Panel("entropy.png", "Entropy", "nats / token", (Series("actor/entropy", "entropy"),),
          "Mean token entropy of the responses under the actor; a collapse towards 0 means the policy stops "
          "exploring.", _generic),
    Panel("grad_norm.png", "Gradient norm", "norm", (Series("actor/grad_norm", "grad_norm"),),
          "The actor's gradient norm before clipping; spikes precede instability.", _generic),
    Panel("clip.png", "PPO clip fraction", "fraction of tokens",
          (Series("actor/pg_clipfrac", "pg_clipfrac"), Series("actor/pg_clipfrac_lower", "pg_clipfrac_lower")),
          "Tokens whose probability ratio was clipped; near 0 on policy (one update per batch), high values mean "
          "updates larger than the clip range.", _generic),
    Panel("rollout_probs.png", "Rollout vs actor token probabilities", "|p_rollout - p_actor|",
          (Series("training/rollout_probs_diff_mean", "rollout_probs_diff_mean"),
           Series("training/rollout_probs_diff_max", "rollout_probs_diff_max")),
          "The same tokens' probability under the rollout engine and under the actor: the weight hand-over's "
          "health signal (near 0 when the engine runs the actor's weights). Dashed: the flag bound "
          "(launch.health.mismatch_bound); triangles: the worst token of each step that passed it.", _probs_absent),
    Panel("routing.png", "MoE routing: rollout vs actor", "share",
          (Series("rollout/routing_disagreement", "response tokens routed differently"),
           Series("rollout/mismatch_routing_share", "their share of the summed |p_rollout - p_actor|")),
          "Tokens whose top-k experts the actor's router picks differently from the rollout engine's (in any MoE "
          "layer, at the row that scores the token), and how much of the probability mismatch above they carry: "
          "a high share says routing (routing replay, correction=r3, removes it), a low one precision. A route changed "
          "at an earlier row reaches a token through attention and counts as precision here: a lower bound on "
          "routing's part.",
          _routing_absent),
    Panel("advantages.png", "Advantages", "advantage",
          (Series("critic/advantages/max", "max"), Series("critic/advantages/mean", "mean"),
           Series("critic/advantages/min", "min")),
          "GRPO's group-normalised advantages; max = min = 0 means every response of each group got the same "
          "reward: no learning signal in that step.", _generic),
    Panel("truncation.png", "Length truncation", "fraction",
          (Series("response_length/clip_ratio", "response_length/clip_ratio"),
           Series("prompt_length/clip_ratio", "prompt_length/clip_ratio"),
           Series("response/aborted_ratio", "response/aborted_ratio")),
          "Fraction of responses that hit max_response_length (and of prompts at max_prompt_length); a high "
          "response clip ratio means the length limit, not the model, ends most answers.", _generic),
)  # fmt: skip

REWARD = Panel(
    "reward_split.png", "Reward and its parts", "fraction / score",
    (Series("critic/score/mean", "score"), Series("reward/format", "format ok"),
     Series("reward/accuracy", "accuracy")),
    "The reward function's score per training step with its parts: the fraction of responses in the required "
    "format and the fraction with a correct answer (diamonds: validation).",
    lambda cfg: "no reward metrics",
)  # fmt: skip


def series_of(run: Run, key: str) -> tuple[list[int], list[float | None]]:
    xs = list(run.steps)
    return xs, [get(run.steps[s], key) for s in xs]


def present(run: Run, panel: Panel) -> list[Series]:
    return [s for s in panel.series if any(get(m, s.key) is not None for m in run.steps.values())]


def validation(run: Run, part: str) -> tuple[str | None, list[int], list[float]]:
    """(verl's key, steps, values) of the validation mean of `part` (acc, format, timeout): for accuracy
    the key the recipe judges by (launch.learning.accuracy_key) where the run logged it, else the first."""
    keys = sorted(
        {k for v in run.validations.values() for k in v if (m := validation_key(k)) and m.metric == part}
    )
    if not keys:
        return None, [], []
    judged = _sel(run.config, "launch.learning.accuracy_key") if part == "acc" else None
    k = judged if judged in keys else keys[0]
    xs = [s for s, v in run.validations.items() if get(v, k) is not None]
    return k, xs, [float(run.validations[s][k]) for s in xs]


def notes(run: Run, panel: Panel) -> list[str]:
    """What the numbers say, in words, where a reader should not have to squint."""
    out = []
    if panel.name == "truncation.png":
        _, ys = series_of(run, "response_length/clip_ratio")
        vals = [y for y in ys if y is not None]
        limit = _sel(run.config, "verl.data.max_response_length")
        if vals and max(vals) >= 0.5:
            out.append(
                f"response_length/clip_ratio was {min(vals):.2f}-{max(vals):.2f}: most responses hit the "
                f"length limit{f' (data.max_response_length={limit} tokens)' if limit else ''}"
            )
    if panel.name == "rollout_probs.png":
        v = mismatch.verdict(run)
        if v.cause != "not measured":
            out.append(v.line)
        seq = mismatch.sequence_line(run)
        if seq:
            out.append(seq)
    if panel.name == "advantages.png":
        flat = [
            s
            for s, m in run.steps.items()
            if get(m, "critic/advantages/max") == get(m, "critic/advantages/min") == 0
        ]
        if flat:
            out.append(f"{len(flat)} of {len(run.steps)} steps had all advantages 0 (no learning signal)")
    return out


def timeouts(run: Run) -> str:
    """The grader timeouts in one sentence (training from the tally, validation from verl)."""
    parts = []
    xs, ys = series_of(run, "reward/timeouts")
    counted = [y for y in ys if y is not None]
    if counted:
        parts.append(
            f"{int(sum(counted))} grader timeouts over {len(counted)} training steps (reward/timeouts)"
        )
    elif run.tally_steps:
        parts.append(
            "training steps: grader timeouts not logged (the run's reward function does not return them)"
        )
    else:
        parts.append(
            "training steps: no grader-timeout count (reward/timeouts comes from the reward tally, "
            "tools/reward/tally.py, which this run did not write)"
        )
    key, vx, vy = validation(run, "timeout")
    if key:
        parts.append(
            f"validation: {key} " + ", ".join(f"step {s}: {v:.3f}" for s, v in zip(vx, vy, strict=True))
        )
    return "; ".join(parts)
