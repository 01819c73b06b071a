"""patches/verl: verl's Megatron actor path on CPU without Transformer Engine (docs/design.md §7b).

The proof that DeepSeek-V3 weights reach the Megatron actor: the project's `hf-to-mcore --layer-spec
local` checkpoint, loaded by verl's own loader into the model verl builds (local layer spec, no TE),
gives through verl's forward function and the actor's logits processor the logits and log-probs of
transformers' DeepseekV3ForCausalLM on the same weights and the same left-padded batch.

Without the patches: verl asks for the TE spec (NameError: TENorm); its forward always packs sequences
(local attention: "Packed sequence is not supported"); the unpacked branch refuses a logits processor;
the DeepSeek-V3 converter rejects the local spec's names; the model is moved to "cpu:cpu".
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import upstream_tree
from tests.published.megatron.test_megatron_cpu import tiny  # noqa: F401  (the shared fixture)

pytestmark = [pytest.mark.upstream, pytest.mark.megatron]
CHILD = Path(__file__).with_name("megatron_child.py")
REPO = Path(__file__).resolve().parents[3]


def test_current_device_string() -> None:
    upstream_tree("verl")
    from verl.utils.device import get_current_device

    assert get_current_device() == "cpu"
    torch.zeros(1).to(get_current_device())  # a device string torch accepts


def test_converter_accepts_local_spec_names(tiny) -> None:  # noqa: F811
    from transformers import AutoConfig
    from verl.models.mcore.weight_converter import McoreToHFWeightConverterDpskv3

    hf_config = AutoConfig.from_pretrained(tiny[0])
    conv = McoreToHFWeightConverterDpskv3(hf_config, mcore_config=None)
    t = torch.zeros(2)
    cases = {
        "decoder.layers.0.self_attention.q_layernorm.weight": [
            "model.layers.0.self_attn.q_a_layernorm.weight"
        ],
        "decoder.layers.1.self_attention.kv_layernorm.weight": [
            "model.layers.1.self_attn.kv_a_layernorm.weight"
        ],
        "decoder.layers.0.pre_mlp_layernorm.weight": ["model.layers.0.post_attention_layernorm.weight"],
        "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight": [
            "model.layers.1.mlp.experts.3.down_proj.weight"
        ],
    }
    for name, want in cases.items():
        assert conv.convert_param(name, [t])[0] == want, name
    names, _ = conv.convert_param("decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight", [t, t])
    assert names == [
        "model.layers.1.mlp.experts.2.gate_proj.weight",
        "model.layers.1.mlp.experts.2.up_proj.weight",
    ]


@pytest.fixture(scope="module")
def actor(tiny, tmp_path_factory) -> tuple[dict, dict]:  # noqa: F811
    upstream_tree("verl")
    out = tmp_path_factory.mktemp("actor")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        [sys.executable, str(CHILD), str(port), str(tiny[0]), str(tiny[1]), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-5000:]
    return torch.load(out / "actor.pt"), json.loads((out / "actor.json").read_text())


@pytest.mark.slow
def test_local_spec_without_transformer_engine(actor) -> None:
    _, info = actor
    assert info["te"] is False
    names = set(info["names"])
    assert "decoder.layers.0.self_attention.q_layernorm.weight" in names  # the local spec's norm module
    assert not any("layer_norm_weight" in n for n in names)  # no TE-fused norms


@pytest.mark.slow
def test_unpacked_forward_matches_per_row(actor, tiny) -> None:  # noqa: F811
    """Each left-padded row gives the log-probs of the same row run alone without padding."""
    from transformers import DeepseekV3ForCausalLM

    got, _ = actor
    model = DeepseekV3ForCausalLM.from_pretrained(tiny[0], torch_dtype=torch.float32).eval()
    for i in range(got["ids"].shape[0]):
        keep = got["mask"][i]
        with torch.no_grad():
            row = model(got["ids"][i, keep].unsqueeze(0)).logits[0].log_softmax(-1)
        want = row.gather(-1, got["label"][i, keep].unsqueeze(-1)).squeeze(-1)
        lm = got["label_mask"][i, keep]
        assert torch.allclose(got["log_probs"][i, keep][lm], want[lm], atol=1e-4), i
        assert (got["log_probs"][i, ~keep] == 0).all()  # padding positions stay empty


@pytest.mark.slow
def test_actor_logits_equal_transformers(actor, tiny) -> None:  # noqa: F811
    from transformers import DeepseekV3ForCausalLM

    got, _ = actor
    model = DeepseekV3ForCausalLM.from_pretrained(tiny[0], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(got["ids"], attention_mask=got["mask"].long(), position_ids=got["pos"]).logits
    m = got["mask"]
    assert got["logits"].shape == want.shape
    diff = (got["logits"][m] - want[m]).abs().max()
    assert torch.allclose(got["logits"][m], want[m], atol=1e-4, rtol=1e-4), diff
