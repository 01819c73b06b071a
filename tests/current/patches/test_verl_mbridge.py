"""verl's vanilla-mbridge path on megatron-core 0.16.1 and the CPU platform (current stack).

verl 0.9.1's Megatron engine builds every model through a bridge; for DeepSeek-V3 that is mbridge 0.15.1's
DeepseekV3Bridge (vanilla_mbridge). Three verl patches make it work here:
- `verl-mbridge-MLA-bridges-pass-original_max_position_embeddings-to-megatron-core-0.16`: mbridge passes
  MLATransformerConfig the field 0.16 renamed (TypeError "unexpected keyword argument
  'max_position_embeddings'" without the patch);
- `verl-mbridge-build-models-on-the-CPU-platform`: the local layer spec without Transformer Engine ("name
  'TENorm' is not defined" without it), the local spec's MLA norm names and SequentialMLP expert names
  (global expert ids under expert parallelism), and the model and the exported weights on the CPU;
- `verl-mbridge-the-DeepSeek-V3-bridge-reads-the-model-s-YaRN-under-transformers-5`.
The tiny-cpu recipe's grouped routing (moe_router_num_groups/moe_router_group_topk, which mbridge leaves out)
reaches the bridge through override_transformer_config (patches/current/carried.toml).

Each test runs gloo ranks of tests/current/patches/mcore_child.py over the trees under test, with the
tiny-cpu recipe's Megatron overrides and a tiny random DeepSeek-V3 checkpoint made here. What is not the
production path: DeepseekV3Bridge reads checkpoints through its FP8-dequantising reader, which opens every
file on "cuda"; the checkpoint has no FP8 tensors, for which that reader hands the tensors back as stored,
so the test reads with mbridge's own SafeTensorIO (the base reader) on the CPU. The training run itself loads
the Megatron checkpoint (use_dist_checkpointing), not HF weights through the bridge.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import upstream_tree
from tests.current.patches import mcore_child

pytestmark = [pytest.mark.upstream, pytest.mark.slow]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    upstream_tree("verl")
    path = tmp_path_factory.mktemp("tiny") / "hf"
    return path, mcore_child.write_tiny_checkpoint(str(path))


@pytest.fixture(scope="module")
def bridge_config(checkpoint, tmp_path_factory) -> dict:
    return mcore_child.run("config", checkpoint[0], tmp_path_factory.mktemp("config"))[0]


def test_deepseek_v3_config_builds_on_megatron_core_0_16(bridge_config) -> None:
    assert bridge_config["class"] == "MLATransformerConfig"
    assert bridge_config["kv_lora_rank"] == 16  # the model's, through the bridge
    # YaRN's original context length lands in 0.16's field (the model's rope_scaling says 256)
    assert bridge_config["original_max_position_embeddings"] == 256


def test_deepseek_v3_bridge_reads_the_model_s_yarn(bridge_config) -> None:
    """mbridge 0.15.1 reads YaRN with `"rope_scaling" in hf_config`, which transformers 5 answers False
    (rope_scaling is an alias of rope_parameters, not an entry of the config): without verl's patch the bridge
    builds plain RoPE with its defaults (factor 1, original length 4096)."""
    assert bridge_config["rope_type"] == "yarn"
    assert bridge_config["rotary_scaling_factor"] == 4.0
    assert bridge_config["original_max_position_embeddings"] == 256


def test_deepseek_v3_builds_loads_and_exports_on_cpu(checkpoint, tmp_path) -> None:
    """Expert parallelism 2 over two gloo ranks: each rank holds 2 of the 4 routed experts."""
    path, hf = checkpoint
    ranks = mcore_child.run("bridge", path, tmp_path, world=2, ep=2)
    for rank, rep in enumerate(ranks):
        assert rep["devices"] == ["cpu"], rep
        # the local spec: MLA's norms are modules of their own, the routed experts a SequentialMLP
        assert rep["local_norm_names"] == [
            "input_layernorm.weight",
            "pre_mlp_layernorm.weight",
            "self_attention.kv_layernorm.weight",
            "self_attention.q_layernorm.weight",
        ], rep
        assert rep["sequential_experts"] == 1 and rep["local_experts"] == ["0", "1"], rep
        assert rep["not_loaded"] == [], rep
        assert rep["direct"] and all(rep["direct"].values()), rep["direct"]
        assert rep["export_devices"] == ["cpu"], rep
        exported = torch.load(tmp_path / f"exported.{rank}.pt")
        assert sorted(exported) == sorted(hf)
        differ = [n for n, t in exported.items() if not torch.equal(t.to(hf[n].dtype), hf[n])]
        assert not differ, differ


def test_the_recipe_gives_the_bridge_the_model_s_expert_groups(checkpoint, tmp_path) -> None:
    """DeepSeek-V3 routes each token within its topk_group best expert groups (n_group of them); mbridge's
    DeepseekV3Bridge leaves that out (the published stack patched verl's config converter for it). On this
    stack the tiny-cpu recipe passes the model's groups through override_transformer_config."""
    path, _ = checkpoint
    rep = mcore_child.run("groups", path, tmp_path)[0]
    assert rep["mbridge"] == [None, None], rep  # upstream's behaviour: why the recipe must say it
    assert rep["recipe"] == [2, 1], rep  # tools.miniature.assets.model_config: n_group 2, topk_group 1
