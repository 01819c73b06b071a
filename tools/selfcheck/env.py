"""Where the patched upstreams come from: the stack's trees under third_party/ (vLLM is not
installed on CPU)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tools.patches.config import tree_of

REPO = Path(__file__).resolve().parents[2]


def device() -> str:
    """npu when torch_npu sees a device, else cpu."""
    try:
        import torch
        import torch_npu  # noqa: F401

        if torch.npu.is_available() and torch.npu.device_count() > 0:
            return "npu"
    except ImportError:
        pass
    return "cpu"


def put_trees_on_path() -> None:
    """Make `import vllm` / `import verl` resolve to the patched trees when vLLM is not installed."""
    try:
        import importlib.metadata

        importlib.metadata.version("vllm")
        return  # installed (the npu profile installs the patched tree editable)
    except importlib.metadata.PackageNotFoundError:
        pass
    for name in ("vllm", "verl"):
        tree = str(tree_of(name))
        if tree not in sys.path:
            sys.path.insert(0, tree)
    # verl's vLLM modules ask for vLLM's version (docs/design.md §2); "cpu" in it would switch platforms
    meta = Path(tempfile.mkdtemp(prefix="selfcheck-meta-"))
    info = meta / "vllm-0.9.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.9.1\n")
    sys.path.append(str(meta))
