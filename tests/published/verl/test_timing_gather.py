"""patches/verl: the timing all-gather works on gloo (verl/utils/profiler/performance.py).

`topk_reduce_ratio_min_max` gathered a 0-d tensor into shape-(1,) buffers: nccl only counts elements,
gloo checks shapes and raises. Two gloo ranks in child processes, with different timings.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.upstream

CHILD = textwrap.dedent(
    """
    import sys, torch.distributed as dist
    from verl.utils.profiler.performance import topk_reduce_ratio_min_max
    rank = int(sys.argv[2])
    dist.init_process_group("gloo", init_method=sys.argv[1], rank=rank, world_size=2)
    ratio, lo, hi = topk_reduce_ratio_min_max(1.0 + rank)
    assert (lo, hi) == (1.0, 2.0), (lo, hi)
    dist.destroy_process_group()
    """
)


def test_timing_gather_on_gloo() -> None:
    from tests.conftest import upstream_tree

    upstream_tree("verl")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, url, str(r)], stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(e[-2000:] for e in errs)
