"""patches/verl: the HF rollout serves `rollout.name=hf` again (verl/workers/rollout/hf_rollout.py).

verl 0.6.0 dropped ("hf", "sync") from the rollout registry, and HFRollout no longer matched the rollout
base class (constructor from configs, async resume/update_weights/release). Here it is built the way the
FSDP and Megatron workers build every rollout, given weights the way they hand them over (per-tensor HF
names), and must generate what transformers' own greedy `generate` does with the same weights.
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

    from tools.launch.assets import model_config

    cfg = model_config(vocab_size=96)
    cfg = DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    ref = DeepseekV3ForCausalLM(cfg).eval()
    return cfg, ref


def _rollout(cfg):
    from verl.workers.config import RolloutConfig
    from verl.workers.rollout import get_rollout_class

    rollout_cfg = RolloutConfig(name="hf", mode="sync", response_length=6, prompt_length=5, do_sample=False)
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
