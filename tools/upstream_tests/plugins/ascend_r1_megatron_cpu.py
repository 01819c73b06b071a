"""A CPU shim for megatron-core's own unit tests (tests/unit_tests), loaded with `-p ascend_r1_megatron_cpu`.

Megatron's test harness assumes a CUDA machine with Transformer Engine: its conftest's autouse `set_env`
fixture asks `is_te_min_version`, which raises without TE, so every test errors before it starts; and
`Utils.initialize_distributed` calls `torch.cuda.set_device` and starts an nccl group. Without CUDA the
shim changes the HARNESS only, never megatron-core itself, the same on the pristine and the patched tree:

- the conftest's own `is_te_min_version` answers False when Transformer Engine is not installed;
- `Utils.initialize_distributed` runs with `torch.cuda.set_device` a no-op, one device counted, and the
  process group on gloo; one process (WORLD_SIZE=1, LOCAL_RANK=0 unless set), on a free MASTER_PORT;
- the 0.16 conftest's test-data download to /opt/data is not attempted (no network here; it only warns);
- process groups are destroyed where megatron merely drops them: `Utils.initialize_model_parallel` (before
  it builds new ones) and `Utils.destroy_model_parallel` destroy every group but the default one, and so
  does the end of a test that left no model-parallel state. Dropped groups cost nothing with nccl, but each
  gloo group keeps its threads: thousands over the suite (the runner stops a run at 2000).

With CUDA available the shim does nothing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket

import pytest
import torch

ACTIVE = not torch.cuda.is_available()

if ACTIVE:
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def _te_installed() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


@contextlib.contextmanager
def _cpu_distributed():
    """torch.cuda device calls and an nccl process group, as one CPU device and gloo, for one call."""
    cuda, dist = torch.cuda, torch.distributed
    saved = cuda.set_device, cuda.device_count, dist.init_process_group
    real_init = dist.init_process_group

    def init_process_group(*args, **kwargs):
        if kwargs.get("backend") in ("nccl", None) and not args:
            kwargs["backend"] = "gloo"
        return real_init(*args, **kwargs)

    cuda.set_device, cuda.device_count, dist.init_process_group = (
        (lambda *_: None),
        (lambda: 1),
        init_process_group,
    )
    try:
        yield
    finally:
        cuda.set_device, cuda.device_count, dist.init_process_group = saved


def _destroy_groups() -> None:
    """Destroy every process group but the default one (their gloo threads end with them)."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return
    c10d = dist.distributed_c10d
    default = c10d._get_default_group()
    for group in list(c10d._world.pg_map):
        if group is not default:
            dist.destroy_process_group(group)


def _no_download(*args, **kwargs):
    raise RuntimeError("ascend-r1 CPU shim: no test-data download (no network)")


def pytest_plugin_registered(plugin, manager) -> None:
    """Adjust megatron's conftest as it registers (its names are bound there at import)."""
    if not ACTIVE or not getattr(plugin, "__file__", "").endswith("conftest.py"):
        return
    if hasattr(plugin, "is_te_min_version") and not _te_installed():
        plugin.is_te_min_version = lambda *args, **kwargs: False
    if hasattr(plugin, "download_and_extract_asset"):
        plugin.download_and_extract_asset = _no_download
    utils = getattr(plugin, "Utils", None)
    if utils is not None and not getattr(utils, "_ascend_r1_cpu", False):
        real = utils.initialize_distributed

        def initialize_distributed(*args, **kwargs):
            with _cpu_distributed():
                return real(*args, **kwargs)

        real_init_mp, real_destroy_mp = utils.initialize_model_parallel, utils.destroy_model_parallel

        def initialize_model_parallel(*args, **kwargs):
            _destroy_groups()  # megatron's own first step, destroy_model_parallel, only drops them
            return real_init_mp(*args, **kwargs)

        def destroy_model_parallel(*args, **kwargs):
            result = real_destroy_mp(*args, **kwargs)
            _destroy_groups()
            return result

        utils.initialize_distributed = staticmethod(initialize_distributed)
        utils.initialize_model_parallel = staticmethod(initialize_model_parallel)
        utils.destroy_model_parallel = staticmethod(destroy_model_parallel)
        utils._ascend_r1_cpu = True


@pytest.fixture(autouse=True)
def _ascend_r1_destroy_orphaned_groups():
    yield
    if not ACTIVE or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return
    try:
        from megatron.core import parallel_state  # the tree under test's
    except ImportError:
        return
    if parallel_state.model_parallel_is_initialized():
        return  # still in use (a module-scoped setup): leave it
    _destroy_groups()
