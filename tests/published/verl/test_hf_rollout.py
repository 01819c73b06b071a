"""patches/verl: the HF rollout serves `rollout.name=hf` again (verl/workers/rollout/hf_rollout.py).

verl 0.6.0 dropped ("hf", "sync") from the rollout registry, and HFRollout no longer matched the rollout
base class (constructor from configs, async resume/update_weights/release). Here it is built the way the
FSDP and Megatron workers build every rollout, given weights the way they hand them over (per-tensor HF
names), and must generate what transformers' own greedy `generate` does with the same weights.

A second patch keeps the rollout from passing the prompt's position ids to `generate()` (transformers
never advances caller-supplied ids, so every generated token got the last prompt position): checked on
a position-sensitive model against a forward pass at the right positions.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import upstream_tree

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def tiny():
    upstream_tree("verl")
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from tools.miniature.assets import model_config

    cfg = model_config(vocab_size=96)
    cfg = DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    ref = DeepseekV3ForCausalLM(cfg).eval()
    return cfg, ref


def _rollout(cfg, response_length: int = 6, prompt_length: int = 5):
    from verl.workers.config import RolloutConfig
    from verl.workers.rollout import get_rollout_class

    rollout_cfg = RolloutConfig(
        name="hf", mode="sync", response_length=response_length, prompt_length=prompt_length, do_sample=False
    )
    cls = get_rollout_class("hf", "sync")
    return cls(config=rollout_cfg, model_config=SimpleNamespace(hf_config=cfg), device_mesh=None)


def test_hf_rollout_generates_with_the_trainers_weights(tiny) -> None:
    from verl import DataProto

    cfg, ref = tiny
    rollout = _rollout(cfg)
    asyncio.run(rollout.resume(tags=["weights"]))
    asyncio.run(rollout.update_weights(iter(ref.state_dict().items())))
    asyncio.run(rollout.resume(tags=["kv_cache"]))
    ids = torch.randint(4, 96, (2, 5), generator=torch.Generator().manual_seed(3))
    batch = DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(5).expand(2, 5),
        },
        meta_info={"eos_token_id": 1, "pad_token_id": 0, "do_sample": False},
    )
    out = rollout.generate_sequences(batch)
    asyncio.run(rollout.release())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6,
                            eos_token_id=1, pad_token_id=0)  # fmt: skip
    got = out.batch["responses"]
    assert got.shape == (2, 6)
    n = want.shape[1] - 5
    assert torch.equal(got[:, :n], want[:, 5:]), (got, want[:, 5:])


def test_hf_rollout_refuses_unknown_weights(tiny) -> None:
    cfg, ref = tiny
    rollout = _rollout(cfg)
    with pytest.raises(KeyError, match="model.layers.99.mlp.weight"):
        asyncio.run(rollout.update_weights(iter([("model.layers.99.mlp.weight", torch.zeros(1))])))
    w = ref.state_dict()["model.norm.weight"]
    with pytest.raises(ValueError, match="shape"):
        asyncio.run(rollout.update_weights(iter([("model.norm.weight", torch.zeros(w.numel() + 1))])))


# ---- the positions of generated tokens (patch: the HF rollout leaves position_ids to generate()) ----


@pytest.fixture(scope="module")
def position_sensitive():
    """A tiny DeepSeek-V3 whose greedy output depends on token positions: at five times the usual init
    scale its rotary positions change the next-token choice (at 0.02 they barely do)."""
    upstream_tree("verl")
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from tools.miniature.assets import model_config

    cfg = model_config(vocab_size=96, initializer_range=0.1)
    cfg = DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    return cfg, DeepseekV3ForCausalLM(cfg).eval()


def _left_padded(n: int = 8, width: int = 12, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of lengths width, width-1, ..., left-padded as verl's dataset pads them."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, 96, (n, width), generator=g)
    mask = torch.ones_like(ids)
    for i in range(n):
        mask[i, :i] = 0
    return ids.masked_fill(mask == 0, pad), mask


def _deficits(model, seq: torch.Tensor, mask: torch.Tensor, prompt_len: int, eos: int) -> torch.Tensor:
    """For each generated token (up to and including the first eos), how far its log-probability lies
    below the best token's under one fp32 forward pass at the positions the left-padded mask implies
    (the reference computation: how the actor scores the response). 0 = the greedy choice."""
    from verl.utils.model import compute_position_id_with_mask
    from verl.utils.torch_functional import get_response_mask

    response = seq[:, prompt_len:]
    full_mask = torch.cat(
        [mask, get_response_mask(response_id=response, eos_token=eos, dtype=mask.dtype)], -1
    )
    with torch.no_grad():
        logits = model(
            input_ids=seq, attention_mask=full_mask, position_ids=compute_position_id_with_mask(full_mask)
        ).logits.float()
    logp = torch.log_softmax(logits[:, prompt_len - 1 : -1], dim=-1)
    chosen = logp.gather(-1, response.unsqueeze(-1)).squeeze(-1)
    return (logp.max(-1).values - chosen)[full_mask[:, prompt_len:].bool()]


def test_hf_rollout_generates_at_the_right_positions(position_sensitive) -> None:
    from verl import DataProto
    from verl.utils.model import compute_position_id_with_mask

    cfg, ref = position_sensitive
    ids, mask = _left_padded()
    positions = compute_position_id_with_mask(mask)  # what verl's dataset stores with each prompt
    eos, new, width = 1, 16, ids.shape[1]
    kw = {"do_sample": False, "max_new_tokens": new, "eos_token_id": eos, "pad_token_id": 0}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        right = ref.generate(ids, attention_mask=mask, **kw)  # transformers derives positions from the mask
        stuck = ref.generate(ids, attention_mask=mask, position_ids=positions, **kw)  # never advanced
    # the model and the reference can tell the two apart: with stuck positions some tokens are far
    # from greedy under the right positions
    assert _deficits(ref, stuck, mask, width, eos).max() > 1.0
    assert _deficits(ref, right, mask, width, eos).max() < 0.1

    rollout = _rollout(cfg, response_length=new, prompt_length=width)
    asyncio.run(rollout.update_weights(iter(ref.state_dict().items())))
    batch = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": positions},
        meta_info={"eos_token_id": eos, "pad_token_id": 0, "do_sample": False},
    )
    out = rollout.generate_sequences(batch).batch
    seq = out["input_ids"]
    # every generated token is the greedy choice at its true position (bf16 rollout against the fp32
    # reference: a near-tie may differ slightly, hence the tolerance) ...
    assert _deficits(ref, seq, mask, width, eos).max() < 0.1
    # ... and the sequences are exactly transformers' own left-padded greedy generation
    n = right.shape[1]
    assert torch.equal(seq[:, :n], right), (seq[:, width:n], right[:, width:])
    # the positions handed on with the response continue the prompt's (the actor scores with them)
    want = torch.cat([positions, positions[:, -1:] + torch.arange(1, new + 1)], -1)
    assert torch.equal(out["position_ids"], want)
