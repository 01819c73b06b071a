"""Import a patched upstream from the tree under test (`upstream_tree`), never from elsewhere.

`make verify-patch-tests` points `ASCEND_R1_TREE_<NAME>` at scratch trees built without one patch and
runs each patch's tests in a fresh pytest process; these helpers make sure that the modules the tests
exercise come from that tree (the editable install points at third_party/).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import upstream_tree

# verl's vLLM modules ask importlib.metadata for vLLM's version; vLLM is not installed on CPU, its tree
# is on the path. A minimal dist-info says "0.9.1" (a version with "cpu" in it would switch vLLM to
# its CPU platform). docs/design.md §2b.
VLLM_DIST_INFO = "vllm-0.9.1.dist-info"


def import_from_tree(upstream: str, module: str) -> ModuleType:
    """Import `module` with upstream `upstream`'s tree first on sys.path; fail if it comes from elsewhere."""
    tree = upstream_tree(upstream).resolve()
    top = module.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None and not Path(loaded.__file__).resolve().is_relative_to(tree):
        pytest.fail(f"{top} already imported from {loaded.__file__}, not from {tree}")
    if str(tree) not in sys.path:
        sys.path.insert(0, str(tree))
    mod = importlib.import_module(module)
    where = Path(mod.__file__).resolve()
    if not where.is_relative_to(tree):
        pytest.fail(f"imported {module} from {where}, not from the tree under test {tree}")
    return mod


def vllm_metadata_dir(tmp_root: Path) -> Path:
    """A folder holding a minimal vLLM 0.9.1 dist-info, to put on sys.path beside the vLLM tree."""
    info = tmp_root / VLLM_DIST_INFO
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.9.1\n")
    return tmp_root


def import_vllm_rollout(tmp_root: Path) -> ModuleType:
    """verl's vllm_rollout_spmd from the tree under test, with vLLM's tree on the path and a gloo
    world of one (vLLMRollout asks torch.distributed for the world size)."""
    import socket

    import torch.distributed as dist

    import_from_tree("vllm", "vllm")
    meta = str(vllm_metadata_dir(tmp_root))
    if meta not in sys.path:
        sys.path.append(meta)
    mod = import_from_tree("verl", "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd")
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return mod
