"""patches/current/megatron: a synchronous torch_dist save spawns no multiprocessing Manager.

megatron-core 0.16.1 collects the writes' results through the queue of a spawned Manager even when the
writes run in the saving process (AsyncSaveShardedStrategy.save, what verl 0.9.1's actor checkpoint
uses): a second Python process per saving rank (~0.2 GiB on this machine) that stays up for the rest of
the job. Each test saves in a child process of one gloo rank (tests/current/megatron/
checkpoint_save_child.py) and loads the checkpoint back.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import upstream_tree

pytestmark = [pytest.mark.megatron]
REPO = Path(__file__).resolve().parents[3]


def save_in_child(mode: str, out: Path) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        [sys.executable, "-m", "tests.current.megatron.checkpoint_save_child", mode, str(port), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    tree = upstream_tree("megatron").resolve()
    assert report["module"].startswith(str(tree)), f"megatron-core from {report['module']}, not {tree}"
    return report


def test_a_synchronous_save_leaves_no_manager_process(tmp_path) -> None:
    report = save_in_child("sync", tmp_path)
    assert report["loads_back_equal"], report
    assert not report["manager_queue"], "the synchronous save spawned a Manager for its write results"
    assert report["left_running"] == [], f"processes left running after the save: {report['left_running']}"


def test_an_async_request_still_reports_its_results_across_processes(tmp_path) -> None:
    """The async path is upstream's: its save function may run in another process, so its results keep
    the Manager's queue."""
    report = save_in_child("async", tmp_path)
    assert report["loads_back_equal"], report
    assert report["manager_queue"], report
