"""Checkpoints that a restart can reach: on more than one node, the checkpoint folder must be the same
storage on every node (a shared file system), or each node saves shards that a restart placed elsewhere
cannot read. The preflight writes a marker with a fresh token from the driver and reads it on every node of
the Ray cluster (a zero-CPU task pinned to each node); a node that does not see the same token fails the
run before verl starts, naming the node and the fix. tests/tools/launch/test_shared_storage.py."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from pathlib import Path

from tools import atomic
from tools.launch.run import TrainError

MARKER = ".ascend-r1-shared-storage"
Reader = Callable[[Path], Mapping[str, str | None]]  # marker path -> {node: what it read, None: no file}


def write_marker(folder: Path) -> str:
    """A fresh token in `folder`/MARKER (atomically); the token."""
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    atomic.write_bytes(folder / MARKER, token.encode())
    return token


def verdict(folder: Path, token: str, seen: Mapping[str, str | None], nodes: int) -> None:
    """Refuse a checkpoint folder some node does not share (or a cluster with fewer nodes than the recipe)."""
    apart = {n: v for n, v in seen.items() if v != token}
    if not apart and len(seen) >= nodes:
        return
    said = "; ".join(
        f"{n}: {'no such file' if v is None else 'a different file (another storage with the same path)'}"
        for n, v in sorted(apart.items())
    )
    where = (
        f"the marker the driver wrote there was not found on {len(apart)} of {len(seen)} node(s) ({said})"
        if apart
        else f"only {len(seen)} node(s) of the recipe's {nodes} answered"
    )
    raise TrainError(
        f"the checkpoint folder {folder} is not shown to be the same storage on every node: {where};"
        " a restart on another node could not read the shards saved there",
        fix="put the run folders (the checkpoints are in them) on a file system every node mounts at the same"
        " path (NFS, Lustre, a parallel file system): ASCEND_R1_OUTPUTS=<a folder there> make ray-job ...,"
        " then run again",
    )


def check(folder: Path, nodes: int, reader: Reader | None = None) -> None:
    """The marker written here and read on every node (`reader`: ray_reader by default)."""
    made = not folder.exists()
    token = write_marker(folder)
    try:
        verdict(folder, token, (reader or ray_reader)(folder / MARKER), nodes)
    finally:
        (folder / MARKER).unlink(missing_ok=True)
        if made:
            folder.rmdir()  # verl makes it when it saves


def ray_reader(marker: Path, address: str = "auto") -> dict[str, str | None]:
    """{node ip: the marker's text on that node, None when absent}, from one task pinned to each alive node of
    the Ray cluster at `address`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def read(path: str) -> str | None:
        p = Path(path)
        return p.read_text() if p.is_file() else None

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        refs = {
            n["NodeManagerAddress"]: read.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(str(marker))
            for n in alive
        }
        return {ip: ray.get(ref, timeout=120) for ip, ref in refs.items()}
    finally:
        ray.shutdown()
