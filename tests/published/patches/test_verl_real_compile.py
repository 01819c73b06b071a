"""verl patch `verl-megatron-workers-real-torch.compile...` (docs/design.md §3).

MindSpeed's replacement of torch.compile is emulated by a pass-through of the same shape as
MindSpeed's (returns a plain wrapper that calls the function), registered in a stand-in for
MindSpeed's patch registry (`mindspeed.patch_utils.MindSpeedPatchesManager.patches_info`), which is
where the patched verl finds the original. Inside `real_torch_compile()` an `eager`-backend compile
must really go through dynamo; after the block, normal or by exception, the pass-through is back.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tests.published.patches.trees import import_from_tree

pytestmark = pytest.mark.upstream


def pass_through_compile(*args, **kwargs):
    """Stands in for MindSpeed's torch.compile replacement: never compiles."""
    if args and callable(args[0]):
        fn = args[0]

        def wrapper(*a, **k):
            return fn(*a, **k)

        return wrapper

    def compile_wrapper(fn):
        def wrapper(*a, **k):
            return fn(*a, **k)

        return wrapper

    return compile_wrapper


@pytest.fixture
def mindspeed_loaded(monkeypatch):
    """torch.compile / torch.jit.script replaced by the pass-through, originals in the registry."""
    real_compile, real_script = torch.compile, torch.jit.script
    registry = types.SimpleNamespace(
        patches_info={
            "torch.compile": types.SimpleNamespace(orig_func=real_compile),
            "torch.jit.script": types.SimpleNamespace(orig_func=real_script),
        }
    )
    fake = types.ModuleType("mindspeed.patch_utils")
    fake.MindSpeedPatchesManager = registry
    monkeypatch.setitem(sys.modules, "mindspeed.patch_utils", fake)
    monkeypatch.setattr(torch, "compile", pass_through_compile)
    monkeypatch.setattr(torch.jit, "script", pass_through_compile)
    return real_compile, real_script


@pytest.fixture(scope="module")
def rc():
    return import_from_tree("verl", "verl.workers.rollout.npu.real_compile")


def _f(x):
    return torch.sin(x) * 2 + 1


def test_real_compile_inside_pass_through_after(rc, mindspeed_loaded):
    real_compile, real_script = mindspeed_loaded
    assert not rc.is_real_compile()
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with rc.real_torch_compile() as swapped:
        assert set(swapped) == {"torch.compile", "torch.jit.script"}
        assert torch.compile is real_compile and torch.jit.script is real_script
        assert rc.is_real_compile()
        compiled = torch.compile(_f, backend="eager")
        assert hasattr(compiled, "_torchdynamo_orig_callable"), "eager compile returned no dynamo wrapper"
        module = torch.compile(torch.nn.Linear(2, 2), backend="eager")
        assert isinstance(module, torch._dynamo.eval_frame.OptimizedModule)
        traced = torch.compile(_f, backend=recording_backend)
        x = torch.randn(4)
        assert torch.allclose(traced(x), _f(x))
        assert len(graphs) == 1, "the backend never saw a graph: nothing was compiled"
    assert torch.compile is pass_through_compile and torch.jit.script is pass_through_compile
    assert not hasattr(torch.compile(_f, backend="eager"), "_torchdynamo_orig_callable")


def test_pass_through_restored_after_an_exception(rc, mindspeed_loaded):
    with pytest.raises(RuntimeError, match="engine failed"), rc.real_torch_compile():
        assert rc.is_real_compile()
        raise RuntimeError("engine failed to build")
    assert torch.compile is pass_through_compile and torch.jit.script is pass_through_compile


def test_without_mindspeed_nothing_changes(rc, monkeypatch):
    monkeypatch.delitem(sys.modules, "mindspeed.patch_utils", raising=False)
    before = torch.compile
    with rc.real_torch_compile() as swapped:
        assert swapped == {} and torch.compile is before
    assert torch.compile is before and rc.is_real_compile()


def test_whatever_was_there_is_put_back(rc, mindspeed_loaded, monkeypatch):
    """Not MindSpeed's pass-through but another wrapper installed later: that one comes back."""

    def other(*a, **k):
        return pass_through_compile(*a, **k)

    monkeypatch.setattr(torch, "compile", other)
    with rc.real_torch_compile():
        assert rc.is_real_compile()
    assert torch.compile is other


@pytest.mark.slow  # imports verl's Megatron worker (megatron-core)
def test_megatron_worker_builds_the_rollout_with_the_real_compile(rc, mindspeed_loaded, monkeypatch):
    """The hook: ActorRolloutRefWorker._build_rollout constructs the rollout inside real_torch_compile.

    Everything around the construction that needs devices or a cluster is stubbed: the device mesh,
    the RNG of the device module, the rollout class (which records what torch.compile was while it was
    being built, as vllm-ascend's torchair compile would see it).
    """
    from types import SimpleNamespace

    import torch.distributed.device_mesh as device_mesh
    from omegaconf import OmegaConf

    workers = import_from_tree("verl", "verl.workers.megatron_workers")
    seen = []

    class RecordingRollout:
        def __init__(self, config, model_config, device_mesh):
            seen.append(rc.is_real_compile())
            compiled = torch.compile(_f, backend="eager")  # what the engine build would do
            seen.append(hasattr(compiled, "_torchdynamo_orig_callable"))

    mesh_dim = SimpleNamespace(get_local_rank=lambda: 0)
    monkeypatch.setattr(
        device_mesh,
        "init_device_mesh",
        lambda *a, **k: {"dp": mesh_dim, "infer_tp": mesh_dim, "infer_pp": mesh_dim},
    )
    monkeypatch.setattr(workers, "get_rollout_class", lambda name, mode: RecordingRollout)
    monkeypatch.setattr(
        workers,
        "omega_conf_to_dataclass",
        lambda cfg, dataclass_type=None: SimpleNamespace(mode="sync", name="vllm"),
    )
    monkeypatch.setattr(workers, "log_gpu_memory_usage", lambda *a, **k: None)
    rng = SimpleNamespace(
        get_rng_state=lambda: None, manual_seed=lambda s: None, set_rng_state=lambda s: None
    )
    monkeypatch.setattr(workers, "get_torch_device", lambda: rng)

    worker = object.__new__(workers.ActorRolloutRefWorker)
    worker.config = OmegaConf.create(
        {
            "rollout": {
                "name": "vllm",
                "tensor_model_parallel_size": 1,
                "data_parallel_size": 1,
                "pipeline_model_parallel_size": 1,
            },
            "model": {},
        }
    )
    worker._world_size = 1
    monkeypatch.setattr(type(worker), "world_size", property(lambda self: 1), raising=False)
    worker._register_dispatch_collect_info = lambda *a, **k: None
    worker.bridge = object()  # skips the weight-converter setup
    worker._is_actor = False  # no switch to trainer mode (needs the actor)
    worker._build_rollout()
    assert seen == [True, True], "the rollout was not built with the real torch.compile"
    assert torch.compile is pass_through_compile  # MindSpeed's pass-through back for training
