"""tools/selfcheck/routing.py's verdict, from id arrays (the engine and Megatron parts run in the selfcheck
itself and in tests/current/patches/test_vllm_cpu_routed_experts.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tools.selfcheck.result import CheckFailed
from tools.selfcheck.routing import _align_layers, compare

pytestmark = pytest.mark.every_stack


def ids(tokens: int, layers: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack(
        [np.stack([rng.choice(8, 2, replace=False) for _ in range(layers)]) for _ in range(tokens)]
    ).astype(np.int32)


def test_a_few_flipped_tokens_pass_with_their_share():
    trainer = [ids(10, 2, s) for s in range(4)]
    engine = [t.copy() for t in trainer]
    row = engine[0][3, 1]  # one token, one layer: one of its two experts replaced
    row[0] = next(e for e in range(8) if e not in row)
    figure = compare(engine, trainer)
    assert figure.startswith("2.5% of 40 prompt tokens routed differently in some of 2 MoE layers")


def test_a_capture_that_hands_over_other_ids_fails():
    trainer = [ids(10, 2, s) for s in range(4)]
    local = [(t % 4) for t in trainer]  # e.g. EP-local ids instead of global ones
    with pytest.raises(CheckFailed, match="other ids than it routed"):
        compare(local, trainer)
    with pytest.raises(CheckFailed, match="tokens, layers, k"):
        compare([t[:, :1] for t in trainer], trainer)


def test_the_trainer_ids_go_to_the_engine_rows_of_the_moe_layers():
    engine = [np.zeros((5, 3, 2), np.int32)]
    trainer = [ids(5, 2, 0)]
    full = _align_layers(engine, trainer, [1, 2])
    assert (full[0][:, 0] == 0).all() and (full[0][:, 1:] == trainer[0]).all()
