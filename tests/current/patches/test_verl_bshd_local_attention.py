"""verl patch `verl-mcore-padded-batches-give-megatron-core-s-own-attention-its-4-D-mask` (current stack).

With use_remove_padding=False (packed THD sequences need Transformer Engine's attention) verl 0.9.1's
Megatron engine runs padded BSHD batches: preprocess_bshd_engine hands the model the [B, S] valid-token mask,
which megatron-core's own DotProductAttention (the local spec, no Transformer Engine) applies to its
[B, heads, Sq, Skv] scores as given: "The size of tensor a (...) must match the size of tensor b (...)".
The patch builds the [B, 1, Sq, Skv] causal-and-padding mask (True where masked) when Transformer Engine is
absent, and postprocess_bshd_engine reads the valid tokens back from its diagonal.

The test runs verl's own BSHD model forward (gptmodel_forward_model_engine, data_format="bshd") on a tiny
local-spec DeepSeek-V3 (MLA + MoE, tests/tools/weights/megatron_cpu.build_model) in a gloo rank
(tests/current/patches/mcore_child.py): three sequences of different lengths padded into one batch give, per
token, the logits of each sequence run alone without padding.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import upstream_tree
from tests.current.patches import mcore_child

pytestmark = [pytest.mark.upstream, pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    upstream_tree("verl")
    upstream_tree("megatron")
    hf_dir = tmp_path_factory.mktemp("tiny")
    mcore_child.write_tiny_config(str(hf_dir))
    out = tmp_path_factory.mktemp("bshd")
    mcore_child.run("bshd", hf_dir, out)
    return torch.load(out / "bshd.pt")


def test_the_local_attention_gets_a_causal_and_padding_mask(run) -> None:
    mask, lengths = run["mask"], run["lengths"]
    s = max(lengths)
    assert mask.shape == (len(lengths), 1, s, s) and mask.dtype == torch.bool
    causal = torch.ones(s, s).tril().bool()
    for b, n in enumerate(lengths):
        valid = torch.arange(s) < n
        keep = causal & valid[:, None] & valid[None, :]
        assert torch.equal(mask[b, 0], ~keep), b  # True where masked


def test_a_padded_batch_gives_each_sequence_s_own_logits(run) -> None:
    assert [t.shape[0] for t in run["batched"]] == run["lengths"]
    for b, (got, want) in enumerate(zip(run["batched"], run["alone"], strict=False)):
        assert got.shape == want.shape, (b, got.shape, want.shape)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), (b, (got - want).abs().max())
