"""Routing disagreement between the rollout engine and the trainer, and the split of the log-prob mismatch.

An MoE token is routed to its top-k experts by the rollout engine (vLLM, vllm-ascend) and again by the
trainer's router (Megatron's TopKRouter) when it computes the token's log-prob. Where two experts' scores are
close the two routers can pick different experts; the trainer then scores a token that the rollout sampled
from another function. These functions count that, from the expert ids both sides chose:

    routing_disagreement(engine_ids, actor_ids, mask) -> share of tokens whose top-k sets differ (any layer)
    split_mismatch(prob_diff, disagrees, bound) -> how much of verl's rollout/actor mismatch is routing

Expert-id arrays are [tokens, k] or [tokens, layers, k] (verl's `routed_experts` is [batch, seq, layers, k];
flatten batch and sequence first, or use `token_disagrees`, which keeps any leading shape). The order of the
k ids does not matter (a top-k is a set: vLLM's grouped top-k returns them unsorted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.integer]


def _as_ids(name: str, ids: npt.ArrayLike) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim < 2:
        raise ValueError(f"{name}: expert ids must be [..., k] with a token axis, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: expert ids must be integers, got {arr.dtype}")
    return arr


def layer_disagrees(engine_ids: npt.ArrayLike, actor_ids: npt.ArrayLike) -> np.ndarray:
    """Per token and layer: True where the two top-k sets differ. Shapes [..., k] -> [...]."""
    a, b = _as_ids("engine_ids", engine_ids), _as_ids("actor_ids", actor_ids)
    if a.shape != b.shape:
        raise ValueError(f"engine ids {a.shape} and actor ids {b.shape} differ in shape")
    return np.any(np.sort(a, axis=-1) != np.sort(b, axis=-1), axis=-1)


def token_disagrees(engine_ids: npt.ArrayLike, actor_ids: npt.ArrayLike) -> np.ndarray:
    """Per token: True where the top-k sets differ in any MoE layer. [..., layers, k] -> [...];
    [tokens, k] (one layer) -> [tokens]."""
    per_layer = layer_disagrees(engine_ids, actor_ids)
    return per_layer if np.asarray(engine_ids).ndim == 2 else np.any(per_layer, axis=-1)


def _masked(values: np.ndarray, mask: npt.ArrayLike | None) -> np.ndarray:
    if mask is None:
        return values.reshape(-1)
    m = np.asarray(mask, dtype=bool)
    if m.shape != values.shape:
        raise ValueError(f"mask {m.shape} does not match the tokens {values.shape}")
    return values[m]


def routing_disagreement(
    engine_ids: npt.ArrayLike, actor_ids: npt.ArrayLike, mask: npt.ArrayLike | None = None
) -> float:
    """Share of (masked) tokens whose top-k experts differ between engine and actor in any MoE layer.
    NaN when the mask leaves no token."""
    picked = _masked(token_disagrees(engine_ids, actor_ids), mask)
    return float(picked.mean()) if picked.size else float("nan")


def layer_disagreement(
    engine_ids: npt.ArrayLike, actor_ids: npt.ArrayLike, mask: npt.ArrayLike | None = None
) -> list[float]:
    """Per MoE layer: the share of (masked) tokens whose top-k sets differ there. Ids [..., layers, k]."""
    per = layer_disagrees(engine_ids, actor_ids)
    if np.asarray(engine_ids).ndim < 3:
        raise ValueError("layer_disagreement needs ids with a layer axis: [..., layers, k]")
    out = []
    for layer in range(per.shape[-1]):
        picked = _masked(per[..., layer], mask)
        out.append(float(picked.mean()) if picked.size else float("nan"))
    return out


@dataclass(frozen=True)
class MismatchSplit:
    """verl's rollout/actor probability mismatch (|p_rollout - p_actor| per token), split by routing."""

    tokens: int
    routed_differently: int  # tokens whose top-k differ in some layer
    above_bound: int  # tokens whose probability difference passes `bound`
    above_bound_routed_differently: int
    mean_diff_routing: float  # mean |dp| over the tokens routed differently (NaN if none)
    mean_diff_same_route: float  # mean |dp| over the tokens routed the same (precision alone)
    routing_share: float  # share of the summed |dp| that the differently-routed tokens carry

    @property
    def verdict(self) -> str:
        """One line: which cause the worst tokens point at."""
        if self.above_bound == 0:
            return "no token passes the bound"
        share = self.above_bound_routed_differently / self.above_bound
        cause = "routing" if share >= 0.5 else "precision"
        return (
            f"{cause}: {self.above_bound_routed_differently} of {self.above_bound} tokens above the bound "
            "were routed differently"
        )


def split_mismatch(
    prob_diff: npt.ArrayLike, disagrees: npt.ArrayLike, mask: npt.ArrayLike | None = None, bound: float = 0.1
) -> MismatchSplit:
    """Split the per-token |p_rollout - p_actor| (verl's `training/rollout_probs_diff_*` before reduction)
    into the tokens routed differently (routing) and the rest (precision: same experts, other kernels).
    `disagrees`: token_disagrees(...) of the same tokens; `mask`: the response mask."""
    diff = np.abs(np.asarray(prob_diff, dtype=np.float64))
    dis = np.asarray(disagrees, dtype=bool)
    if diff.shape != dis.shape:
        raise ValueError(f"prob_diff {diff.shape} and disagrees {dis.shape} differ in shape")
    diff, dis = _masked(diff, mask), _masked(dis, mask)
    total = float(diff.sum())
    above = diff > bound
    return MismatchSplit(
        tokens=int(diff.size),
        routed_differently=int(dis.sum()),
        above_bound=int(above.sum()),
        above_bound_routed_differently=int((above & dis).sum()),
        mean_diff_routing=float(diff[dis].mean()) if dis.any() else float("nan"),
        mean_diff_same_route=float(diff[~dis].mean()) if (~dis).any() else float("nan"),
        routing_share=float(diff[dis].sum() / total) if total > 0 else 0.0,
    )


def step_metrics(
    engine_ids: npt.ArrayLike,
    actor_ids: npt.ArrayLike,
    mask: npt.ArrayLike | None = None,
    prob_diff: npt.ArrayLike | None = None,
    bound: float = 0.1,
) -> dict[str, float]:
    """The per-step metrics, named as the run's metrics are: `rollout/routing_disagreement` and, where the
    per-token probability difference is given, the routing/precision split of the mismatch."""
    dis = token_disagrees(engine_ids, actor_ids)
    picked = _masked(dis, mask)
    out = {"rollout/routing_disagreement": float(picked.mean()) if picked.size else float("nan")}
    if prob_diff is not None:
        split = split_mismatch(prob_diff, dis, mask, bound)
        out["rollout/mismatch_routing_share"] = split.routing_share
        out["rollout/mismatch_diff_mean_routed_differently"] = split.mean_diff_routing
        out["rollout/mismatch_diff_mean_same_route"] = split.mean_diff_same_route
    return out
