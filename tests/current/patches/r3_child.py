"""One gloo rank running verl 0.9.1's Megatron engine with routing replay R3 on a padded (BSHD) batch.

python tests/current/patches/r3_child.py <port> <hf model dir> <out dir>

The tiny local-spec DeepSeek-V3 of mcore_child, built with verl's router-replay patch; verl's own
MegatronEngineWithLMHead.forward_backward_batch (forward only, padded batches as the CPU recipes run them)
scores two sequences in one micro-batch, then each alone, replaying the same rollout routes, and once without
replay. Writes <out dir>/r3.pt with the log-probs of each.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from tests.current.patches import mcore_child  # noqa: E402
from tests.tools.weights import megatron_cpu as M  # noqa: E402

LENGTHS = [7, 4]  # prompt + response tokens of each sequence
RESPONSE = [3, 2]  # response tokens of each


def _engine(hf_dir: str, model):
    from types import SimpleNamespace

    from transformers import AutoConfig
    from verl.workers.config.engine import EngineRouterReplayConfig, McoreEngineConfig
    from verl.workers.engine.megatron.transformer_impl import MegatronEngineWithLMHead

    engine = object.__new__(MegatronEngineWithLMHead)
    engine.engine_config = McoreEngineConfig(
        use_remove_padding=False,
        use_mbridge=True,
        vanilla_mbridge=True,
        router_replay=EngineRouterReplayConfig(mode="R3"),
    )
    engine.model_config = SimpleNamespace(
        hf_config=AutoConfig.from_pretrained(hf_dir),
        mtp=SimpleNamespace(enable=False, enable_train=False),
        tokenizer=SimpleNamespace(pad_token_id=0),
    )
    engine.module = [model]
    engine.tf_config = model.config
    engine.enable_routing_replay = True
    engine.mini_layer_topk_idx_list = []
    return engine


def forward(engine, seqs, routes, responses, *, replay: bool) -> dict:
    """verl's engine forward (forward only) of `seqs` in one padded micro-batch, with the rollout's `routes`
    (None: none in the batch): per sequence its log-probs and, where the engine returned them, the routes it
    recorded and its routing flags."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    nested = lambda ts: torch.nested.nested_tensor(ts, layout=torch.jagged)  # noqa: E731
    response_mask = torch.zeros(len(seqs), max(responses), dtype=torch.long)
    for i, n in enumerate(responses):
        response_mask[i, :n] = 1
    tensors = {
        "input_ids": nested(seqs),
        "loss_mask": nested([torch.ones(len(s), dtype=torch.long) for s in seqs]),
        "temperature": torch.ones(len(seqs)),
        "response_mask": response_mask,
    }
    if routes is not None:
        tensors["routed_experts"] = nested(routes)
    data = TensorDict(tensors, batch_size=len(seqs))
    tu.assign_non_tensor(
        data, use_dynamic_bsz=False, micro_batch_size_per_gpu=len(seqs), enable_routing_replay=replay
    )
    with torch.no_grad():
        out = engine.forward_backward_batch(data, loss_function=None, forward_only=True)["model_output"]
    return {
        "log_probs": [t[:-1].clone() for t in out["log_probs"].unbind()],
        **{
            k: [t.clone() for t in out[k].unbind()]
            for k in ("routed_experts", "routing_disagrees")
            if k in out
        },
    }


def _log_probs(engine, seqs, routes, responses, replay: bool) -> list[torch.Tensor]:
    return forward(engine, seqs, routes, responses, replay=replay)["log_probs"]


def replay_engine(port: int, hf_dir: str):
    """This process as one gloo rank, verl's router-replay patch applied, the tiny model built with routing
    replay in its config and verl's engine around it: (hf config, model, engine)."""
    torch.set_num_threads(1)
    M.init_dist(0, 1, port, 1, 1, 1)
    from verl.utils.megatron.router_replay_patch import apply_router_replay_patch

    apply_router_replay_patch()
    plain_config = M.mcore_config

    def replay_config(*args, **kwargs):
        config = plain_config(*args, **kwargs)
        config.enable_routing_replay = True
        return config

    M.mcore_config = replay_config
    hf, model = mcore_child._random_model(hf_dir)
    return hf, model, _engine(hf_dir, model)


def run_child(child: str, tmp_path_factory, result: str) -> dict:
    """Run `child` (a script taking <port> <hf model dir> <out dir>) on the tiny config; its `result` file."""
    import socket
    import subprocess

    from tests.conftest import upstream_tree

    upstream_tree("verl")
    upstream_tree("megatron")
    hf_dir = tmp_path_factory.mktemp("tiny")
    mcore_child.write_tiny_config(str(hf_dir))
    out = tmp_path_factory.mktemp("out")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    done = subprocess.run(
        [sys.executable, child, str(port), str(hf_dir), str(out)],
        cwd=repo, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    name = os.path.basename(child)
    assert done.returncode == 0, f"{name}: exit {done.returncode}\n{(done.stdout + done.stderr)[-5000:]}"
    return torch.load(out / result)


def main() -> int:
    port, hf_dir, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    hf, model, engine = replay_engine(port, hf_dir)
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(1, hf["vocab_size"], (n,), generator=g) for n in LENGTHS]
    experts, k = hf["n_routed_experts"], hf["num_experts_per_tok"]
    layers = hf["num_hidden_layers"]
    # the rollout's routes: k distinct experts a token and layer, drawn apart from the actor's router; the
    # rollout routes every token but the last one it generated (verl aligns that)
    routes = [
        torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range((n - 1) * layers)]).view(
            n - 1, layers, k
        )
        for n in LENGTHS
    ]
    batched = _log_probs(engine, seqs, routes, RESPONSE, replay=True)
    alone = [
        _log_probs(engine, [s], [r], [n], replay=True)[0]
        for s, r, n in zip(seqs, routes, RESPONSE, strict=True)
    ]
    native = _log_probs(engine, seqs, routes, RESPONSE, replay=False)
    torch.save({"batched": batched, "alone": alone, "native": native}, os.path.join(out, "r3.pt"))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
