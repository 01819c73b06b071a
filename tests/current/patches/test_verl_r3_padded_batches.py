"""verl patch `verl-router-replay-R3-replays-the-rollout-s-routes-in-padded-BSHD-batches` (current stack).

With use_remove_padding=False (the CPU recipes: packed THD sequences need Transformer Engine's attention)
verl 0.9.1's Megatron engine forwards padded BSHD micro-batches, and Megatron's router sees their
[s_pad, b] tokens flattened sequence-major; R3 packed the rollout's routes without the padding, so the
first log-prob pass stopped with "Router replay tensors are not aligned: scores=(14, 4), targets=(11, 2)".
The patch pads the routes (and the replay mask) as the forward pads its input ids and lays them out in the
router's order; padded rows keep native routes.

The test runs verl's own engine forward (MegatronEngineWithLMHead.forward_backward_batch, forward only,
router replay R3 as verl's worker sets it) on the tiny local-spec DeepSeek-V3 (MLA + MoE) in a gloo rank
(tests/current/patches/r3_child.py), replaying rollout routes drawn apart from the actor's router: two
sequences of different lengths in one padded micro-batch give each sequence's log-probs scored alone with
the same routes, and those differ from the log-probs without replay (the routes were replayed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.current.patches import r3_child

pytestmark = [pytest.mark.upstream, pytest.mark.slow]
CHILD = Path(__file__).parent / "r3_child.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return r3_child.run_child(str(CHILD), tmp_path_factory, "r3.pt")


def test_a_padded_batch_replays_each_sequences_routes(run) -> None:
    for i, (batched, alone) in enumerate(zip(run["batched"], run["alone"], strict=True)):
        assert batched.shape == alone.shape, i
        torch.testing.assert_close(batched, alone, rtol=0, atol=1e-5, msg=f"sequence {i}")


def test_the_routes_were_replayed_not_ignored(run) -> None:
    moved = [float((b - n).abs().max()) for b, n in zip(run["batched"], run["native"], strict=True)]
    assert min(moved) > 1e-3, moved
