"""One gloo rank (world size 1) exercising a stack's patched megatron-core on CPU, for
tests/<stack>/megatron/test_megatron_cpu.py (each stack's megatron-core differs, this code does not).

The test side: `tiny_checkpoint` (the fixture's body: the tiny model in HF format and as a local-spec
checkpoint), `run_child` (one child process, its JSON report) and the `check_*` bodies of the tests. The
child side, from the checkout:

python -m tests.megatron_child <what> <port> <hf model dir> <local-spec checkpoint dir> <out dir> [<metadata>]

<metadata>: JSON, the `metadata` the stack's megatron-core wants for the distributed optimizer's
sharded_state_dict (what the stack's verl passes); left out, none is passed.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from tests.tools.weights import megatron_cpu as M

REPO = Path(__file__).resolve().parents[1]


def tiny_checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny DeepSeek-V3 (assets' model_config) in HF format and as a local-spec Megatron checkpoint
    written by the project's hf-to-mcore (the body of the test modules' module-scoped `tiny` fixture)."""
    from tests.conftest import upstream_tree

    upstream_tree("megatron")
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from tools.miniature.assets import model_config

    root = tmp_path_factory.mktemp("tiny")
    cfg = model_config(vocab_size=128)
    torch.manual_seed(5)
    hf_cfg = DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    DeepseekV3ForCausalLM(hf_cfg).save_pretrained(root / "hf")
    (root / "hf" / "config.json").write_text(json.dumps({**cfg, "architectures": ["DeepseekV3ForCausalLM"]}))
    r = subprocess.run(
        [sys.executable, "-m", "tools.weights", "hf-to-mcore", str(root / "hf"), str(root / "mc"),
         "--threads", "1", "--layer-spec", "local"],  # fmt: skip
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return root / "hf", root / "mc"


def run_child(what: str, tiny, out: Path, *, metadata: dict[str, Any] | None = None) -> dict:
    """Run `what` in a child process on the tiny model; its report (out/<what>.json)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hf, mc = tiny
    extra = [] if metadata is None else [json.dumps(metadata)]
    r = subprocess.run(
        [sys.executable, "-m", "tests.megatron_child", what, str(port), str(hf), str(mc), str(out), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads((out / f"{what}.json").read_text())


def check_device_fallback(tiny, out: Path) -> None:
    """The RNG tracker forks and restores the CPU generator; the causal mask and the global memory
    buffer are made on the CPU."""
    rep = run_child("rng", tiny, out)
    assert rep == {
        "default_restored": True,
        "tracked_advanced": True,
        "mask_device": "cpu",
        "mask_causal": True,
        "buffer_device": "cpu",
    }


def check_mla_matches_transformers(tiny, out: Path) -> None:
    """The local-spec MLA model's logits are transformers' DeepseekV3ForCausalLM's on the same weights."""
    from transformers import DeepseekV3ForCausalLM

    run_child("logits", tiny, out)
    got = torch.load(out / "logits.pt")
    model = DeepseekV3ForCausalLM.from_pretrained(tiny[0], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(got["ids"]).logits
    assert got["logits"].shape == want.shape
    assert torch.allclose(got["logits"], want, atol=1e-4, rtol=1e-4), (got["logits"] - want).abs().max()


def check_optimizer_steps(tiny, out: Path) -> None:
    """The distributed optimizer takes a step: a finite, non-zero gradient norm, the parameters move."""
    rep = run_child("optimizer", tiny, out)
    assert rep["ok"] and rep["finite"] and rep["grad_norm"] > 0, rep
    assert rep["changed"], rep


def check_optimizer_checkpoint_resumes(tiny, out: Path, *, metadata: dict[str, Any] | None = None) -> None:
    """A torch_dist checkpoint of model and distributed optimizer resumes to the same parameters."""
    rep = run_child("optim_ckpt", tiny, out, metadata=metadata)
    assert rep["max_diff"] < 1e-6, rep


def _hf(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def _loaded_model(hf_dir: str, ckpt: str):
    """The local-spec GPTModel, loaded from a `hf-to-mcore --layer-spec local` checkpoint with no key
    mapping: the names the model asks for are the names in the checkpoint."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    hf = _hf(hf_dir)
    model = M.build_model(hf)
    M.fill_sentinel(model)
    dist_checkpointing.load(model.sharded_state_dict(), ckpt, strict=StrictHandling.ASSUME_OK_UNEXPECTED)
    left = [n for n, t in M._loadable(model) if torch.isnan(t).any()]
    assert not left, f"not loaded: {left}"
    return hf, model


def rng_and_buffers(out: str) -> dict:
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.transformer.utils import get_default_causal_mask

    tracker = tensor_parallel.get_cuda_rng_tracker()
    torch.manual_seed(0)
    want = torch.rand(2)
    torch.manual_seed(0)
    with tracker.fork():
        a = torch.rand(3)
    got = torch.rand(2)  # the default generator is where it was before the fork
    with tracker.fork():
        b = torch.rand(3)  # the tracked state moved on
    mask = get_default_causal_mask(4)
    buf = parallel_state.get_global_memory_buffer().get_tensor((2, 3), torch.float32, "t")
    return {
        "default_restored": torch.equal(want, got),
        "tracked_advanced": not torch.equal(a, b),
        "mask_device": mask.device.type,
        "mask_causal": mask.tolist() == torch.triu(torch.ones(4, 4), 1).bool().tolist(),
        "buffer_device": buf.device.type,
    }


def logits(hf_dir: str, ckpt: str, out: str) -> dict:
    hf, model = _loaded_model(hf_dir, ckpt)
    ids = torch.randint(0, hf["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    torch.save({"ids": ids, "logits": M.logits(model.eval(), ids)}, os.path.join(out, "logits.pt"))
    return {}


def _ddp_and_optimizer(model):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp = DistributedDataParallel(
        model.config,
        DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True),
        model,
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=True, clip_grad=1.0), [ddp]
    )
    return ddp, opt


def _train_step(hf, ddp, opt, seed: int):
    ddp.zero_grad_buffer()
    opt.zero_grad()
    ids = torch.randint(0, hf["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(seed))
    pos = torch.arange(12).unsqueeze(0).expand_as(ids)
    ddp(ids, pos, attention_mask=None).float().logsumexp(-1).mean().backward()
    ddp.finish_grad_sync()
    return opt.step()


def optimizer_step(hf_dir: str, ckpt: str, out: str) -> dict:
    hf, model = _loaded_model(hf_dir, ckpt)
    ddp, opt = _ddp_and_optimizer(model)
    name, param = next((n, p) for n, p in model.named_parameters() if "linear_q_down_proj" in n)
    before = param.detach().clone()
    ok, grad_norm, _ = _train_step(hf, ddp, opt, 2)
    return {
        "ok": bool(ok),
        "grad_norm": float(grad_norm),
        "finite": math.isfinite(float(grad_norm)),
        "changed": not torch.equal(before, param.detach()),
        "param": name,
    }


def optimizer_checkpoint(hf_dir: str, ckpt: str, out: str, metadata: dict[str, Any] | None) -> dict:
    """Two steps, save model + distributed-optimizer state with torch_dist, load into a fresh model and
    optimizer (as a resumed run does), step both: the same parameters come out. `metadata`: what the
    stack's megatron-core wants passed to the optimizer's sharded_state_dict (None: nothing)."""
    from megatron.core import dist_checkpointing

    hf, model = _loaded_model(hf_dir, ckpt)
    ddp, opt = _ddp_and_optimizer(model)
    for seed in (1, 2):
        _train_step(hf, ddp, opt, seed)
    path = os.path.join(out, "ckpt")
    os.makedirs(path)
    model_sd = model.sharded_state_dict()
    meta = {} if metadata is None else {"metadata": metadata}
    dist_checkpointing.save({"model": model_sd, "optimizer": opt.sharded_state_dict(model_sd, **meta)}, path)
    _train_step(hf, ddp, opt, 3)
    want = {n: p.detach().clone() for n, p in model.named_parameters()}

    _, model2 = _loaded_model(hf_dir, ckpt)
    ddp2, opt2 = _ddp_and_optimizer(model2)
    model_sd2 = model2.sharded_state_dict()
    state = dist_checkpointing.load(
        {"model": model_sd2, "optimizer": opt2.sharded_state_dict(model_sd2, is_loading=True, **meta)}, path
    )
    model2.load_state_dict(state["model"], strict=False)
    opt2.load_state_dict(state["optimizer"])
    _train_step(hf, ddp2, opt2, 3)
    diff = max((p.detach() - want[n]).abs().max().item() for n, p in model2.named_parameters())
    return {"max_diff": diff}


def main() -> int:
    what, port, hf_dir, ckpt, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    metadata = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
    torch.set_num_threads(1)
    M.init_dist(0, 1, port, 1, 1, 1)
    if what == "rng":
        report = rng_and_buffers(out)
    elif what == "logits":
        report = logits(hf_dir, ckpt, out)
    elif what == "optim_ckpt":
        report = optimizer_checkpoint(hf_dir, ckpt, out, metadata)
    else:
        report = optimizer_step(hf_dir, ckpt, out)
    with open(os.path.join(out, f"{what}.json"), "w") as f:
        json.dump(report, f)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
