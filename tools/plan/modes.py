"""The planner's trainer modes: step time and tokens/s per device for sync, colocate_async and separate_async,
side by side, from the step-time model's phases (timing.py) plus the weight-sync cost over the real link.

What each mode changes (verl 0.9.1's V1 trainer; docs/async.md):
- sync: the phases in sequence, as timing.py predicts them.
- colocate_async: the same devices, in sequence, but generation is aborted once a batch can be sampled and
  the unfinished responses resume next step (partial rollout). A wave no longer waits for its longest
  response: the decode term's weight reads scale from the longest of a wave's responses to their mean
  (tail factor = mean / E[longest of the wave]); everything else is unchanged (the `naive` weight sync,
  resharding, old log-prob, reference, update).
- separate_async with a split f (share of the devices given to the rollout): the rollout generates on f N
  devices while the trainer trains on (1 - f) N; the step is max(generation / f, training / (1 - f)) plus
  the weight sync, which pauses both (verl aborts the rollout, sends, resumes). Generation and training are
  taken to scale linearly with their devices (the optimistic case); the colocated resharding (gather +
  onload/offload) is gone, replaced by a broadcast of the whole bf16 model from one sender over the
  scale-out link, at the efficiency measured for verl's HCCL engine (SYNC_EFFICIENCY). A split is only
  offered where the memory model says the trainer's share still holds the actor (weights, gradients,
  optimizer states, with the recipe's offloads): the split's plan is composed with launch.nodes reduced.

Tokens/s per device counts every device of the pool (both shares in separate_async).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from tools.errors import run_cli
from tools.plan import memory as M
from tools.plan import timing as T

# verl's HCCL engine synced Qwen3-30B-A3B (61 GB bf16) over 2 x 16 910C in ~11 s: 5.3 GB/s effective,
# against the A3's 25 GB/s scale-out link a die (hardware.py): 0.21 of the link (a published HCCL weight sync: Qwen3-30B-A3B over 2x16 910C in ~11 s)
SYNC_EFFICIENCY = 5.3 / 25.0
TRAIN_PHASES = ("old_log_prob", "ref", "update", "other")


@dataclass
class ModeTime:
    mode: str
    step_s: float
    tokens_per_s_per_device: float
    detail: str
    split: float | None = None  # separate_async: the rollout's share of the devices
    fits: bool | None = None  # separate_async: the memory model's verdict on the trainer's share

    def json(self) -> dict[str, Any]:
        return {
            "step_s": round(self.step_s, 3),
            "tokens_per_s_per_device": round(self.tokens_per_s_per_device, 3),
            "split": self.split,
            "fits": self.fits,
        }


def tail_factor(st: T.StepTime) -> float:
    """Decode time with partial rollout / without it: mean response over the expected longest of a wave
    (the weight reads of each decode step dominate the decode term; its KV reads already follow the mean)."""
    s = st.setup
    ro, ln = s.rollout, s.lengths
    engines = max(s.group.world // ro.tp, 1)
    per_engine = math.ceil(s.sequences / engines)
    conc = max(min(ro.max_num_seqs, per_engine, ro.kv_capacity_seqs or per_engine), 1)
    longest = ln.longest_of(conc)
    return min(1.0, ln.response / longest) if longest > 0 else 1.0


def _phase(st: T.StepTime, name: str) -> float:
    ph = st.phases.get(name)
    return ph.seconds if ph else 0.0


def _generate_async(st: T.StepTime) -> tuple[float, float]:
    """(generation seconds with partial rollout, tail factor)."""
    f = tail_factor(st)
    gen = 0.0
    for t in st.phases["generate"].terms:
        gen += t.seconds * (f if t.name == "decode" else 1.0)
    return gen, f


def sync_seconds(st: T.StepTime) -> float:
    """The whole bf16 model from one sender to the rollout's ranks over the scale-out link."""
    g = st.setup.group
    bw = g.chip.scaleout_bw.value * SYNC_EFFICIENCY
    return M.total_params(st.setup.arch) * 2 / bw


def predict(st: T.StepTime, splits: list[tuple[float, bool | None]] = ()) -> list[ModeTime]:
    """Each mode's step time for the step `st` (timing.step) and the separate_async splits given (with the
    memory model's verdict on each)."""
    tokens, world = st.setup.tokens, st.setup.group.world
    per_dev = lambda step: tokens / step / world  # noqa: E731
    out = [ModeTime("sync", st.step_s, per_dev(st.step_s), "the phases in sequence (timing.py)")]
    gen_a, tail = _generate_async(st)
    gen = _phase(st, "generate")
    colo = st.step_s - gen + gen_a
    out.append(
        ModeTime(
            "colocate_async",
            colo,
            per_dev(colo),
            f"generation {gen:.1f} -> {gen_a:.1f} s (the tail cut: decode x{tail:.2f}, mean response / longest "
            "of a wave); the rest as sync",
        )
    )
    train = sum(_phase(st, p) for p in TRAIN_PHASES)
    rollout = gen_a + _phase(st, "reward")  # verl 0.9.1 scores inside the rollout's agent loop
    sync_s = sync_seconds(st)
    for f, fits in splits:
        g_s, t_s = rollout / f, train / (1 - f)
        step = max(g_s, t_s) + sync_s
        bound = "generation" if g_s >= t_s else "training"
        out.append(
            ModeTime(
                "separate_async",
                step,
                per_dev(step),
                f"rollout {f:.0%} of the devices: generation {g_s:.1f} s || training {t_s:.1f} s ({bound}-bound)"
                f" + weight sync {sync_s:.1f} s; no resharding",
                split=f,
                fits=fits,
            )
        )
    return out


def best(modes: list[ModeTime]) -> ModeTime:
    """The fastest mode whose memory verdict is not a refusal."""
    ok = [m for m in modes if m.fits is not False]
    return min(ok, key=lambda m: m.step_s)


def candidate_splits(nodes: int, devices_per_node: int) -> list[tuple[int, float]]:
    """(trainer nodes, rollout share) for whole-node splits (one node at least each side); on a single node,
    half of its devices."""
    if nodes > 1:
        return [(k, (nodes - k) / nodes) for k in range(1, nodes)]
    return [(1, 0.5)] if devices_per_node > 1 else [(1, 0.5)]


def lines(modes: list[ModeTime], unit: str = "device") -> list[str]:
    out = [
        "trainer modes (tools.plan.modes.py; docs/async.md): step time and tokens/s per "
        f"{unit}, each mode on the same devices:"
    ]
    base = modes[0].step_s
    for m in modes:
        gain = base / m.step_s if m.step_s else float("nan")
        fit = (
            ""
            if m.fits is None
            else ("; the trainer's share fits" if m.fits else "; the trainer's share does NOT fit")
        )
        out.append(
            f"  {m.mode:<15}{m.step_s:>9.1f} s  {m.tokens_per_s_per_device:>8.1f} tok/s  x{gain:.2f}  {m.detail}{fit}"
        )
    b = best(modes)
    out.append(
        f"  best: {b.mode}"
        + (f" with {b.split:.0%} of the devices for the rollout" if b.split is not None else "")
        + f" ({base / b.step_s:.2f}x sync); the model assumes linear scaling of each side and staleness <= 1"
    )
    measured = [p for p in PUBLISHED if not p.assumed_inputs]
    if measured:
        errors = ", ".join(f"{p.error():+.0%}" for p in measured)
        out.append(
            f"  error of the predicted speedup on published pairs (every input published): {errors} "
            "(python -m tools.plan.modes)"
        )
    shown = [p for p in PUBLISHED if p.assumed_inputs]
    if shown:
        out.append(
            "  illustrations, not a model error (inputs assumed): "
            + "; ".join(f"{p.name.split(' (')[0]} predicted x{p.sync_step_s / p.predicted():.2f}, published "
                        f"x{p.sync_step_s / p.async_step_s:.2f}, assuming {', '.join(p.assumed_inputs)}"
                        for p in shown)
            + " (python -m tools.plan.modes)"
        )  # fmt: skip
    return out


# ---- the model against published sync/async pairs (docs/async.md) -------------------------------------


@dataclass
class PublishedPair:
    name: str
    source: str
    mode: str
    sync_step_s: float
    async_step_s: float
    generation_s: float  # of the sync step
    training_s: float  # of the sync step: everything the trainer does
    tail: float  # mean response / longest of a wave (1: no tail cut)
    sync_weights_s: float  # the weight sync the async mode adds
    split: float | None  # separate_async: the rollout's share
    split_in_sync: (
        bool  # the sync baseline ran on the same split pools (each side idle while the other works)
    )
    assumed: str
    # the inputs above that are not published figures: a pair with any is an illustration of the model's
    # form, and no error of the model is stated from it
    assumed_inputs: tuple[str, ...] = ()

    def predicted(self) -> float:
        gen = self.generation_s * self.tail
        if self.mode == "colocate_async":
            return self.sync_step_s - self.generation_s + gen
        if self.split_in_sync:  # the pools keep their devices: only the overlap changes
            return max(gen, self.training_s) + self.sync_weights_s
        f = self.split or 0.5
        return max(gen / f, self.training_s / (1 - f)) + self.sync_weights_s

    def error(self) -> float:
        """Relative error of the predicted speedup (sync / async) against the published one."""
        return (self.sync_step_s / self.predicted()) / (self.sync_step_s / self.async_step_s) - 1


PUBLISHED = [
    PublishedPair(
        name="Qwen3-4B GRPO, A3, 2 + 2 NPUs (vllm-project/vime#358)",
        source="178.3 -> 104.0 s a step; trainer wait 54.6% -> 4.4%",
        mode="separate_async",
        sync_step_s=178.3,
        async_step_s=104.0,
        generation_s=0.546 * 178.3,  # the sync trainer waited 54.6% of the step: the generation
        training_s=(1 - 0.546) * 178.3,
        tail=1.0,
        sync_weights_s=8.0e9 / 5.3e9,  # 4B bf16 over HCCL at verl's measured 5.3 GB/s
        split=0.5,
        split_in_sync=True,
        assumed="the sync baseline ran on the same 2 + 2 split (its 54.6% trainer wait says the trainer "
        "idled through generation); no tail cut (lengths not published)",
        assumed_inputs=(
            "the sync baseline on the same split",
            "no tail cut",
            "weight sync at Qwen3-30B-A3B's 5.3 GB/s",
        ),
    ),
    PublishedPair(
        name="Qwen3.5-35B-A3B, 32k responses, colocate_async (verl docs, V1 trainer, GPUs)",
        source="-35.4% step time against sync",
        mode="colocate_async",
        sync_step_s=100.0,
        async_step_s=64.6,
        generation_s=65.0,  # assumed share of the sync step
        training_s=35.0,
        tail=0.35,  # assumed: mean response ~11k of 32k, the longest of a wave at the cap
        sync_weights_s=0.0,  # naive, as in sync
        split=None,
        split_in_sync=False,
        assumed="generation 65% of the sync step and mean response 35% of the longest of a wave (verl "
        "publishes neither); the step in units of the sync step",
        assumed_inputs=("generation 65% of the sync step", "mean response 35% of a wave's longest"),
    ),
]


def published_lines() -> list[str]:
    out = ["the mode model against published sync/async pairs (speedup = sync step / async step):"]
    for p in PUBLISHED:
        pub = p.sync_step_s / p.async_step_s
        pred = p.sync_step_s / p.predicted()
        verdict = (
            f"error {p.error():+.0%}"
            if not p.assumed_inputs
            else "an illustration, not a model error: inputs assumed"
        )
        out.append(
            f"  {p.name}: published x{pub:.2f} ({p.source}); predicted x{pred:.2f} "
            f"({p.predicted():.1f} s); {verdict}. Assumed: {p.assumed}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.plan.modes",
        description="print the mode model against verl's published sync/async step pairs",
    )
    ap.parse_args(argv)
    print("\n".join(published_lines()))
    return 0


if __name__ == "__main__":
    run_cli(main)
