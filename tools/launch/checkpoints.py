"""Checkpoint manifests: what verl saved, sealed by the launcher, and verified before a resume.

verl saves `checkpoints/global_step_N/...` and then writes `latest_checkpointed_iteration.txt` (N). After
verl has finished, the launcher seals every such checkpoint that this run saved: `global_step_N/manifest.json`
lists every file's relative path, size and (below a size limit) a blake2b digest, written atomically. A
`global_step_N` without a manifest is incomplete (its save did not finish under the launcher) and no resume
uses it. Before a resume starts any worker, the checkpoint is verified against its manifest: a missing,
truncated or changed file is named.

Digests: blake2b (128-bit) of each file, streamed in 4 MiB reads. Checkpoints larger than
`ASCEND_R1_MANIFEST_DIGEST_GB` (default 64 GiB) get a size-only manifest (`"mode": "size"`): hashing a
multi-TB 671B checkpoint (~1 GB/s a core) would hold the launcher for hours after each save. A size-only
manifest still catches a missing or truncated file, the common damage of a killed writer or a full disk.

    python -m tools.launch.checkpoints verify outputs/current/tiny-cpu/checkpoints/global_step_3
    python -m tools.launch.checkpoints seal   <global_step_N>   # trust a checkpoint saved without the launcher
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools import atomic
from tools.errors import UserError, run_cli

MANIFEST = "manifest.json"
TRACKER = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"global_step_(\d+)")
CHUNK = 4 << 20
DIGEST_LIMIT_GB = float(os.environ.get("ASCEND_R1_MANIFEST_DIGEST_GB", "64"))
FORMAT = 1


class CheckpointError(UserError):
    """A checkpoint that cannot be used: the message names the file and what is wrong with it."""


def digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(step_dir: Path) -> list[Path]:
    return sorted(
        p for p in step_dir.rglob("*") if p.is_file() and p.name != MANIFEST and ".partial" not in p.name
    )


def write_manifest(step_dir: Path, digest_limit_gb: float | None = None) -> dict:
    """Seal `step_dir`: manifest.json with every file's size and, below the limit, its digest (atomic)."""
    step_dir = Path(step_dir)
    limit = DIGEST_LIMIT_GB if digest_limit_gb is None else digest_limit_gb
    files = _files(step_dir)
    sizes = {p: p.stat().st_size for p in files}
    mode = "digest" if sum(sizes.values()) <= limit * 2**30 else "size"
    entries = []
    for p in files:
        e: dict = {"path": p.relative_to(step_dir).as_posix(), "size": sizes[p]}
        if mode == "digest":
            e["blake2b"] = digest(p)
        entries.append(e)
    m = {"format": FORMAT, "mode": mode, "created": time.time(), "files": entries}
    atomic.write_json(step_dir / MANIFEST, m)
    return m


def read_manifest(step_dir: Path) -> dict | None:
    """The manifest, or None when there is none; a damaged manifest is an error naming it."""
    path = Path(step_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text())
        if not isinstance(m, dict) or not isinstance(m.get("files"), list):
            raise ValueError("no 'files' list")
        return m
    except (ValueError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable manifest ({e})") from None


def verify(step_dir: Path) -> list[str]:
    """What is wrong with a sealed checkpoint, one line per file (empty: intact). Raises when unsealed."""
    step_dir = Path(step_dir)
    m = read_manifest(step_dir)
    if m is None:
        raise CheckpointError(
            f"{step_dir}: no {MANIFEST}; the checkpoint's save did not finish under the launcher"
        )
    problems = []
    for e in m["files"]:
        p = step_dir / e["path"]
        if not p.is_file():
            problems.append(f"{p}: missing (the manifest lists {e['size']} bytes)")
            continue
        size = p.stat().st_size
        if size != e["size"]:
            what = "truncated" if size < e["size"] else "grown"
            problems.append(f"{p}: {what}: {size} bytes, the manifest says {e['size']}")
        elif "blake2b" in e and digest(p) != e["blake2b"]:
            problems.append(f"{p}: changed: its blake2b digest differs from the manifest's")
    return problems


# ---- the checkpoint folder ---------------------------------------------------------------------------


def step_dirs(ckpt: Path) -> dict[int, Path]:
    """{N: ckpt/global_step_N} of every checkpoint folder verl made."""
    if not Path(ckpt).is_dir():
        return {}
    out = {}
    for p in Path(ckpt).iterdir():
        m = STEP_DIR.fullmatch(p.name)
        if m and p.is_dir():
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))


def tracked_step(ckpt: Path) -> int | None:
    """The step in verl's tracker file (None: no tracker or not a number)."""
    try:
        return int((Path(ckpt) / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None


def write_tracker(ckpt: Path, step: int) -> None:
    """Point verl's tracker at global_step_<step> (atomically); step 0 removes it (verl starts afresh)."""
    path = Path(ckpt) / TRACKER
    if step:
        atomic.write_bytes(path, f"{step}\n".encode())
    elif path.exists():
        path.unlink()


def seal_new(ckpt: Path, after: int, log: Callable[[str], None] = print) -> list[int]:
    """After verl has stopped: manifests for the checkpoints this run saved (steps after `after`, up to the
    tracker's step, which verl writes once a save is complete). Later folders are incomplete saves: named.
    Returns the steps sealed."""
    done = tracked_step(ckpt) or 0
    sealed = []
    for n, d in step_dirs(ckpt).items():
        if n <= after:
            continue
        if n > done:
            log(
                f"checkpoint {d.name}: its save did not finish (verl's tracker says {done}): incomplete, not used"
            )
            continue
        t = time.time()
        m = write_manifest(d)
        sealed.append(n)
        size = sum(e["size"] for e in m["files"])
        log(
            f"checkpoint {d.name}: manifest of {len(m['files'])} files, {size / 2**20:.1f} MiB "
            f"({'blake2b digests' if m['mode'] == 'digest' else 'sizes only'}, {time.time() - t:.1f} s)"
        )
    return sealed


@dataclass(frozen=True)
class Damage:
    """The latest finished checkpoint found damaged: its step, its first problem, and the last sealed, intact
    checkpoint before it (None: none)."""

    step: int
    problem: str
    intact: int | None


def damaged_latest(ckpt: Path) -> Damage | None:
    """The latest checkpoint verl finished (its tracker's step or before) when it is sealed and damaged;
    None when it is intact, unsealed, or there is none. Verifies the ones before it, latest first, until one
    is intact."""
    done = tracked_step(ckpt)
    dirs = {n: d for n, d in step_dirs(ckpt).items() if done is not None and n <= done}
    if not dirs:
        return None
    latest = max(dirs)
    if read_manifest(dirs[latest]) is None or not (problems := verify(dirs[latest])):
        return None
    return Damage(latest, problems[0], intact_below(dirs, latest))


def intact_below(dirs: dict[int, Path], below: int) -> int | None:
    """The latest sealed, intact checkpoint before step `below` (verifies each on the way down)."""
    for n in sorted((n for n in dirs if n < below), reverse=True):
        if read_manifest(dirs[n]) is not None and not verify(dirs[n]):
            return n
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.launch.checkpoints", description=__doc__)
    ap.add_argument("action", choices=["verify", "seal"])
    ap.add_argument("step_dir", type=Path, help="a checkpoints/global_step_N folder")
    a = ap.parse_args(argv)
    if not a.step_dir.is_dir():
        raise CheckpointError(f"{a.step_dir}: no such folder", fix="name a checkpoints/global_step_N folder")
    if a.action == "seal":
        m = write_manifest(a.step_dir)
        print(f"{a.step_dir / MANIFEST}: {len(m['files'])} files ({m['mode']})")
        return 0
    problems = verify(a.step_dir)
    for p in problems:
        print(p)
    print(f"{a.step_dir}: " + ("intact" if not problems else f"{len(problems)} damaged file(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    run_cli(main)
