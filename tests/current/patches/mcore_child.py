"""One gloo rank running verl 0.9.1's Megatron paths on CPU; started by the current stack's verl patch tests.

python tests/current/patches/mcore_child.py <what> <rank> <world> <port> <ep> <hf model dir> <out dir>

Writes <out dir>/<what>.<rank>.json (and .pt files where tensors are compared in the test). The verl and
megatron-core imported are the trees under test (tests/conftest.py puts ASCEND_R1_TREE_* on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from tests.tools.weights import megatron_cpu as M  # noqa: E402

RECIPES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "recipes")


def cpu_overrides(hf: dict) -> dict:
    """The Megatron config the tiny-cpu recipe gives verl on the current stack: the base recipe's CPU
    overrides (docs/design.md §7b) and the overlay's local attention and grouped routing."""
    import yaml

    with open(os.path.join(RECIPES, "tiny-cpu.yaml")) as f:
        base = yaml.safe_load(f)["verl"]["actor_rollout_ref"]["actor"]["megatron"][
            "override_transformer_config"
        ]
    with open(os.path.join(RECIPES, "for_stack", "current", "tiny-cpu.yaml")) as f:
        overlay = yaml.safe_load(f)["verl"]["actor_rollout_ref"]["actor"]["megatron"][
            "override_transformer_config"
        ]
    assert overlay["moe_router_num_groups"] == "${launch.model_config.n_group}", overlay
    assert overlay["moe_router_group_topk"] == "${launch.model_config.topk_group}", overlay
    return {
        **base,
        "gradient_accumulation_fusion": overlay["gradient_accumulation_fusion"],
        "moe_router_num_groups": hf["n_group"],
        "moe_router_group_topk": hf["topk_group"],
    }


def _hf(hf_dir: str) -> dict:
    with open(os.path.join(hf_dir, "config.json")) as f:
        return json.load(f)


def _bridge(hf_dir: str):
    from transformers import AutoConfig
    from verl.models.mcore.mbridge import AutoBridge  # applies verl's mbridge patches (apply_patch_mbridge)

    cfg = AutoConfig.from_pretrained(hf_dir)
    # transformers 5 keeps rope_theta in the rope parameters; the recipe sets it for the bridge the same way
    # (actor_rollout_ref.model.override_config.model_config.rope_theta)
    cfg.rope_theta = cfg.rope_parameters["rope_theta"]
    return AutoBridge.from_config(cfg, dtype=torch.bfloat16)


def config(hf_dir: str, out: str, rank: int) -> dict:
    """The bridge's Megatron config."""
    c = _bridge(hf_dir).config
    return {
        "class": type(c).__name__,
        "original_max_position_embeddings": c.original_max_position_embeddings,
        "rope_type": c.rope_type,
        "rotary_scaling_factor": c.rotary_scaling_factor,
        "kv_lora_rank": c.kv_lora_rank,
    }


def groups(hf_dir: str, out: str, rank: int) -> dict:
    """DeepSeek-V3's expert groups in the bridge's config: mbridge's own, then with the recipe's overrides."""
    b = _bridge(hf_dir)
    own = [b.config.moe_router_num_groups, b.config.moe_router_group_topk]
    b.set_extra_args(**cpu_overrides(_hf(hf_dir)))
    return {"mbridge": own, "recipe": [b.config.moe_router_num_groups, b.config.moe_router_group_topk]}


def bridge(hf_dir: str, out: str, rank: int) -> dict:
    """get_model (local spec, CPU), load_weights from the HF checkpoint, export_weights back."""
    from mbridge.core.safetensor_io import SafeTensorIO
    from megatron.core.transformer.moe.experts import SequentialMLP

    hf = _hf(hf_dir)
    b = _bridge(hf_dir)
    b.set_extra_args(**cpu_overrides(hf))
    models = b.get_model(wrap_with_ddp=False)
    model = models[0]
    M.fill_sentinel(model)
    # DeepseekV3Bridge reads through its FP8-dequantising reader, which opens every file on "cuda"
    # (mbridge/models/ext/deepseek_v3/dequant_fp8_safetensor_io.py); the checkpoint here has no FP8 tensors,
    # for which that reader returns the tensors as stored: mbridge's own reader does the same on the CPU
    b._get_safetensor_io = lambda path: SafeTensorIO(b._get_actual_hf_path(path))
    b.load_weights(models, hf_dir)
    not_loaded = [n for n, t in M._loadable(model) if torch.isnan(t.float()).any()]
    exported = {name: t.detach().clone() for name, t in b.export_weights(models)}
    torch.save(exported, os.path.join(out, f"exported.{rank}.pt"))
    names = [n for n, _ in model.named_parameters()]
    # what the local spec's names hold, read straight from the checkpoint (a mapping that loads and exports
    # through the same wrong name would survive the round trip): the MLA norms, and this rank's experts
    from safetensors.torch import load_file

    hf_w = load_file(os.path.join(hf_dir, "model.safetensors"))
    mine = {n.split("decoder.", 1)[1]: t for n, t in model.state_dict().items() if "decoder.layers.1." in n}
    per_rank = hf["n_routed_experts"] // ep_size()
    direct = {
        "q_layernorm": torch.equal(
            mine["layers.1.self_attention.q_layernorm.weight"],
            hf_w["model.layers.1.self_attn.q_a_layernorm.weight"],
        ),
        "kv_layernorm": torch.equal(
            mine["layers.1.self_attention.kv_layernorm.weight"],
            hf_w["model.layers.1.self_attn.kv_a_layernorm.weight"],
        ),
    }
    for i in range(per_rank):
        e = f"model.layers.1.mlp.experts.{per_rank * ep_rank() + i}"
        fc = f"layers.1.mlp.experts.local_experts.{i}"
        direct[f"expert{i}_fc1"] = torch.equal(
            mine[f"{fc}.linear_fc1.weight"],
            torch.cat([hf_w[f"{e}.gate_proj.weight"], hf_w[f"{e}.up_proj.weight"]]),
        )
        direct[f"expert{i}_fc2"] = torch.equal(mine[f"{fc}.linear_fc2.weight"], hf_w[f"{e}.down_proj.weight"])
    return {
        "devices": sorted({p.device.type for p in model.parameters()}),
        "export_devices": sorted({t.device.type for t in exported.values()}),
        "local_norm_names": sorted(
            {n.split(".layers.")[1].split(".", 1)[1] for n in names if "layernorm" in n and ".layers." in n}
        ),
        "sequential_experts": sum(isinstance(m, SequentialMLP) for m in model.modules()),
        "local_experts": sorted(
            {n.split("local_experts.")[1].split(".")[0] for n in names if "local_experts." in n}
        ),
        "not_loaded": not_loaded,
        "direct": direct,
    }


def ep_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_expert_model_parallel_world_size()


def ep_rank() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_expert_model_parallel_rank()


def _random_model(hf_dir: str):
    """The tiny model (local spec) with seeded random weights large enough to matter, in eval mode."""
    hf = _hf(hf_dir)
    torch.manual_seed(3)
    model = M.build_model(hf)
    with torch.no_grad():
        for _, t in M._loadable(model):
            t.normal_(0.0, 0.2)
    model.eval()
    return hf, model


def bshd(hf_dir: str, out: str, rank: int) -> dict:
    """A padded batch through verl's BSHD model forward with the local spec, and each sequence alone."""
    from verl.models.mcore.model_forward import gptmodel_forward_model_engine
    from verl.models.mcore.util import preprocess_bshd_engine

    hf, model = _random_model(hf_dir)
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, hf["vocab_size"], (n,), generator=g) for n in (5, 9, 3)]
    ids = torch.nested.nested_tensor(seqs, layout=torch.jagged)
    _, mask, _ = preprocess_bshd_engine(ids, pre_process=True)
    with torch.no_grad():
        batched = gptmodel_forward_model_engine(model, ids, {}, data_format="bshd")
        alone = [M.logits(model, s.unsqueeze(0))[0] for s in seqs]
    torch.save(
        {
            "mask": mask,
            "batched": [t.clone() for t in batched.unbind()],
            "alone": alone,
            "lengths": [5, 9, 3],
        },
        os.path.join(out, "bshd.pt"),
    )
    return {}


def write_tiny_config(path: str) -> dict:
    """config.json of the tiny DeepSeek-V3 (tools.miniature.assets.model_config, vocabulary 128)."""
    from tools.miniature.assets import model_config

    cfg = {**model_config(vocab_size=128), "architectures": ["DeepseekV3ForCausalLM"]}
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return cfg


def write_tiny_checkpoint(path: str) -> dict:
    """The tiny DeepSeek-V3 (tools.miniature.assets.model_config) as a HF checkpoint in bf16, every tensor
    random (norms, biases included, so that no two names hold equal values), with the index mbridge reads."""
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = write_tiny_config(path)
    hf_cfg = DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(5)
    # save_pretrained writes the checkpoint names (one tensor per expert), not transformers 5's fused modules
    DeepseekV3ForCausalLM(hf_cfg).save_pretrained(path)
    names = load_file(os.path.join(path, "model.safetensors"))
    g = torch.Generator().manual_seed(6)
    tensors = {k: torch.randn(v.shape, generator=g).to(torch.bfloat16) for k, v in sorted(names.items())}
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in tensors}}
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    write_tiny_config(path)  # ours, over the one save_pretrained wrote
    return tensors


def run(what: str, hf_dir, out, world: int = 1, ep: int = 1, timeout: int = 600) -> list[dict]:
    """Start `world` gloo ranks of this script; each rank's report."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                what,
                str(rank),
                str(world),
                str(port),
                str(ep),
                str(hf_dir),
                str(out),
            ],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in range(world)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, log in zip(procs, logs, strict=False):
        assert p.returncode == 0, f"{what}: exit {p.returncode}\n{log[-5000:]}"
    return [json.loads(open(os.path.join(out, f"{what}.{rank}.json")).read()) for rank in range(world)]


def engine_forward(hf_dir: str, out: str, rank: int) -> dict:
    """verl's MegatronEngineWithLMHead.forward_backward_batch (forward only) over a tiny local-spec model.

    The engine object is made without its __init__ (which builds the model through the bridge, an optimizer
    and a checkpoint manager from full configs); it gets what forward_backward_batch reads: its engine config
    (verl's own McoreEngineConfig, padded batches as the tiny-cpu recipe runs them), the model, its
    TransformerConfig and the HF config. Everything from the batch placement on is verl's code."""
    from types import SimpleNamespace

    from tensordict import TensorDict
    from transformers import AutoConfig
    from verl.utils import tensordict_utils as tu
    from verl.workers.config.engine import McoreEngineConfig
    from verl.workers.engine.megatron.transformer_impl import MegatronEngineWithLMHead

    hf, model = _random_model(hf_dir)
    engine = object.__new__(MegatronEngineWithLMHead)
    engine.engine_config = McoreEngineConfig(use_remove_padding=False, use_mbridge=True, vanilla_mbridge=True)
    engine.model_config = SimpleNamespace(
        hf_config=AutoConfig.from_pretrained(hf_dir),
        mtp=SimpleNamespace(enable=False, enable_train=False),
        tokenizer=SimpleNamespace(pad_token_id=0),
    )
    engine.module = [model]
    engine.tf_config = model.config
    engine.enable_routing_replay = False

    g = torch.Generator().manual_seed(4)
    lengths = [7, 4]
    seqs = [torch.randint(1, hf["vocab_size"], (n,), generator=g) for n in lengths]
    nested = lambda ts: torch.nested.nested_tensor(ts, layout=torch.jagged)  # noqa: E731
    data = TensorDict(
        {
            "input_ids": nested(seqs),
            "loss_mask": nested([torch.ones(n, dtype=torch.long) for n in lengths]),
            "temperature": torch.ones(len(lengths)),
        },
        batch_size=len(lengths),
    )
    # one micro-batch of both sequences: padded to the longer one (BSHD)
    tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=len(lengths))
    with torch.no_grad():
        output = engine.forward_backward_batch(data, loss_function=None, forward_only=True)
        alone = [M.logits(model, s.unsqueeze(0))[0] for s in seqs]
    log_probs = output["model_output"]["log_probs"]
    # each position's log-prob of the next token (a sequence's last position has none: left out)
    want = [
        torch.log_softmax(logits[:-1].float(), -1).gather(-1, s[1:, None])[:, 0]
        for s, logits in zip(seqs, alone, strict=True)
    ]
    got = [t[:-1].clone() for t in log_probs.unbind()]
    torch.save({"log_probs": got, "want": want}, os.path.join(out, "engine.pt"))
    return {"device": log_probs.device.type}


MODES = {"config": config, "groups": groups, "bridge": bridge, "bshd": bshd, "engine": engine_forward}


def main() -> int:
    what, rank, world, port, ep = sys.argv[1], *map(int, sys.argv[2:6])
    hf_dir, out = sys.argv[6], sys.argv[7]
    torch.set_num_threads(1)
    M.init_dist(rank, world, port, 1, 1, ep)
    report = MODES[what](hf_dir, out, rank)
    with open(os.path.join(out, f"{what}.{rank}.json"), "w") as f:
        json.dump(report, f)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
