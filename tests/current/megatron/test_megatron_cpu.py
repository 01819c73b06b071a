"""patches/current/megatron: megatron-core 0.16.1 on CPU (gloo) without Transformer Engine (PATCHES.md 7b).

Each test runs one gloo rank of the patched megatron-core (third_party/current/megatron) in a child process
(tests/current/megatron/child.py); no CUDA stand-ins. Without the patches: the RNG tracker, causal mask and
memory buffer ask torch.cuda (AssertionError: Torch not compiled with CUDA enabled); an MLA model cannot
be built with the local spec (DotProductAttention rejects k_channels/v_channels, and MLA takes Transformer
Engine's mock stand-ins for classes: "isinstance() arg 2 must be a type"); the distributed optimizer's
checkpoint cannot be resumed with torch's Adam.
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

pytestmark = [pytest.mark.megatron, pytest.mark.slow]
CHILD = Path(__file__).with_name("child.py")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny DeepSeek-V3 (assets' model_config) in HF format and as a local-spec Megatron checkpoint
    written by the project's hf-to-mcore."""
    upstream_tree("megatron")
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from tools.launch.assets import model_config

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


def _run(what: str, tiny, out: Path) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hf, mc = tiny
    r = subprocess.run(
        [sys.executable, str(CHILD), what, str(port), str(hf), str(mc), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads((out / f"{what}.json").read_text())


def test_device_fallback_rng_tracker_and_buffers(tiny, tmp_path) -> None:
    rep = _run("rng", tiny, tmp_path)
    assert rep == {
        "default_restored": True,
        "tracked_advanced": True,
        "mask_device": "cpu",
        "mask_causal": True,
        "buffer_device": "cpu",
    }


def test_mla_with_the_local_spec_matches_transformers(tiny, tmp_path) -> None:
    from transformers import DeepseekV3ForCausalLM

    _run("logits", tiny, tmp_path)
    got = torch.load(tmp_path / "logits.pt")
    model = DeepseekV3ForCausalLM.from_pretrained(tiny[0], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(got["ids"]).logits
    assert got["logits"].shape == want.shape
    assert torch.allclose(got["logits"], want, atol=1e-4, rtol=1e-4), (got["logits"] - want).abs().max()


def test_distributed_optimizer_steps_on_cpu(tiny, tmp_path) -> None:
    rep = _run("optimizer", tiny, tmp_path)
    assert rep["ok"] and rep["finite"] and rep["grad_norm"] > 0, rep
    assert rep["changed"], rep


def test_distributed_optimizer_checkpoint_resumes_on_cpu(tiny, tmp_path) -> None:
    rep = _run("optim_ckpt", tiny, tmp_path)
    assert rep["max_diff"] < 1e-6, rep
