"""verl patch `verl-megatron-workers-real-torch.compile...` (PATCHES.md section 3).

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

from tests.patches.trees import import_from_tree

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
