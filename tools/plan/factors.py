"""The step-time model's efficiency factors (`Factors`) and the shipped ones a hardware family
(factors.toml): what the model cannot know from peak figures, fitted by calibrate.py."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from tools import atomic
from tools.plan import hardware as H

FACTORS = Path(__file__).resolve().parent / "factors.toml"

# the per-phase fixed costs of Factors, and the phases each applies to
PHASE_FIXED = {
    "generate_fixed_s": "generate",
    "log_prob_fixed_s": "old log-prob, reference",
    "update_fixed_s": "update",
    "other_fixed_s": "other",
}
PHASE_FIXED_OF = {
    "generate": "generate_fixed_s",
    "old_log_prob": "log_prob_fixed_s",
    "ref": "log_prob_fixed_s",
    "update": "update_fixed_s",
    "other": "other_fixed_s",
}


@dataclass(frozen=True)
class Factors:
    """What the model cannot know from peak figures; fitted by calibrate.py. Each is named with what it
    multiplies: an efficiency divides an ideal time, a per-token cost multiplies tokens."""

    train_mfu: float  # update: model FLOP utilisation of the actor's forward + backward
    forward_mfu: float  # old_log_prob, ref and prefill: FLOP utilisation of a forward
    decode_bw: float  # generate: fraction of the HBM bandwidth a decode step achieves
    reshard_bw: float  # reshard: fraction of the link bandwidth the weight gather achieves
    reward_s_per_token: float  # reward: CPU seconds per response token
    other_s_per_token: float  # other: seconds per token (prompt + response)
    # fixed costs: they grow with the count of kernel launches and collectives, not with tokens
    layer_pass_s: float = 0.0  # Megatron phases: host-side seconds a layer, a micro-batch, a pass
    decode_collective_s: float = 0.0  # generate: latency of one decode collective that leaves the node
    # fixed seconds a step of a phase whatever its work (verl handing the phase to its workers, Python,
    # small-model kernel launches): fitted where two runs of one stack tell them from the rates (CPU)
    generate_fixed_s: float = 0.0
    log_prob_fixed_s: float = 0.0  # each of old log-prob and reference
    update_fixed_s: float = 0.0
    other_fixed_s: float = 0.0
    stack: str = "ascend"  # the software stack (hardware.Chip.stack) the fixed-cost factors were fitted on
    source: str = ""
    accuracy: str = ""  # the stated accuracy: held-out errors of the published runs (accuracy.stated)

    def described(self) -> list[tuple[str, str, str]]:
        return [
            ("train_mfu", f"{self.train_mfu:.3f}", "update: FLOP utilisation of forward + backward"),
            ("forward_mfu", f"{self.forward_mfu:.3f}", "old log-prob, reference, prefill: FLOP utilisation"),
            ("decode_bw", f"{self.decode_bw:.3f}", "decode: fraction of HBM bandwidth (weights + KV cache)"),
            ("reshard_bw", f"{self.reshard_bw:.3f}", "weight sync: fraction of the link bandwidth"),
            ("reward_s_per_token", f"{self.reward_s_per_token:.3g}", "reward: CPU s per response token"),
            ("other_s_per_token", f"{self.other_s_per_token:.3g}", "rest of the step: s per token"),
            (
                "layer_pass_s",
                f"{self.layer_pass_s:.3g}",
                "log-probs, update: s a layer a micro-batch a pass (launches, host syncs)",
            ),
            (
                "decode_collective_s",
                f"{self.decode_collective_s:.3g}",
                "decode: s a collective that leaves the node (TP all-reduce, MoE dispatch/combine)",
            ),
        ] + [
            (k, f"{getattr(self, k):.3g}", f"{what}: fixed s a step")
            for k, what in PHASE_FIXED.items()
            if getattr(self, k)
        ]


# a family's rates and fixed costs as the step fits give them (Factors' fitted fields)
FITTED = (
    "train_mfu",
    "forward_mfu",
    "decode_bw",
    "reshard_bw",
    "reward_s_per_token",
    "other_s_per_token",
    "layer_pass_s",
    "decode_collective_s",
)
FIELDS = (*FITTED, *PHASE_FIXED, "stack")  # what factors.toml keeps a family
HEADER = """# Step-time model factors a hardware family (tools/plan/factors.py Factors), each with how it was made.
# [a3]: fitted on the calibration run of published.toml by `python -m tools.plan.refit`
#       (tests/tools/plan/test_plan_time.py checks that a refit reproduces it).
# [a3-cann]: hicann/cann-recipes-train's optimised stack, fitted on its random-weights 671B run (and the
#       seed, where the pair separates fixed costs) by the same command (calibrate_pair.fit_cann).
# [cpu]: fitted on two `make train` run folders of this machine (rates and a fixed cost a phase) by
#       `python -m tools.plan.refit --run <run A> --run <run B> --family cpu` (the runs are not in
#       the repository: their figures are in docs/plan-time.md)."""


def write_factors(family: str, f: Factors, path: Path = FACTORS) -> None:
    """Replace the [family] section of factors.toml, keeping the others."""
    doc = tomllib.loads(path.read_text()) if path.is_file() else {}
    doc[family] = {k: getattr(f, k) for k in FIELDS} | {"source": f.source, "accuracy": f.accuracy}
    lines = [HEADER]
    for fam in sorted(doc):
        lines.append(f"[{fam}]")
        default = {"stack": "cpu" if fam == "cpu" else "ascend"}
        lines += [f"{k} = {doc[fam].get(k, default.get(k, 0.0))!r}" for k in (*FIELDS, "source")]
        if doc[fam].get("accuracy"):
            lines.append(f"accuracy = {doc[fam]['accuracy']!r}")
    atomic.write_bytes(path, ("\n".join(lines) + "\n").encode())


def shipped(family: str = "a3", path: Path = FACTORS) -> Factors:
    return Factors(**tomllib.loads(path.read_text())[family])


def families(path: Path = FACTORS) -> set[str]:
    return set(tomllib.loads(path.read_text()))


def factors_for(group: H.Group) -> tuple[Factors, str]:
    """The default factors of a hardware group, and what to say about them."""
    family = group.key.split("-", 1)[0].lower()
    if family == "a3":
        return shipped(), "fitted on the seed run (A3); the fixed costs with an A2 run"
    if family in families():
        f = shipped(family)
        return f, f"{f.source} (this machine's calibration)"
    return (
        shipped(),
        f"the A3 factors (no {group.key} calibration shipped: `make plan RUN=<a run here>` fits one)"
        + (
            "; their fixed costs (launches, collective latency) are the Ascend stack's and are left out here"
            if group.chip.stack != "ascend"
            else ""
        ),
    )
