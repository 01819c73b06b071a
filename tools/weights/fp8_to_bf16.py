"""DeepSeek-V3 FP8 -> BF16, streamed band by band with bounded memory, resumable.

One output shard per input shard (same file name), scales dropped, every FP8 weight dequantised,
other tensors copied bit for bit. Each shard is written to `<name>.partial` and renamed when complete;
`fp8-to-bf16.state.json` records the source and the finished shards, so a killed run restarts where
it stopped and produces the same bytes as an uninterrupted run.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from tools import atomic
from tools.weights import hf_config
from tools.weights.errors import WeightsError
from tools.weights.safetensors_index import INDEX_NAME, SCALE_SUFFIX, Checkpoint, band_rows
from tools.weights.safetensors_writer import StreamingWriter

STATE_NAME = "fp8-to-bf16.state.json"
DEFAULT_BAND_BYTES = 32 << 20


@dataclass
class Fp8Report:
    files_written: list[str] = field(default_factory=list)
    files_skipped: list[str] = field(default_factory=list)  # already done by an earlier run
    dequantised: int = 0
    copied: int = 0
    config_changes: list[str] = field(default_factory=list)
    copied_files: list[str] = field(default_factory=list)
    total_size: int = 0


def _source_fingerprint(src: Checkpoint) -> dict[str, int]:
    return {f: (src.root / f).stat().st_size for f in src.files}


def _bands(src: Checkpoint, names: list[str], band_bytes: int) -> Iterator[tuple[str, int, int]]:
    for name in names:
        info = src.info(name)
        if not info.shape:
            yield name, -1, -1
            continue
        step = band_rows(info.shape, src.out_dtype(name).itemsize, band_bytes)
        for r0 in range(0, info.shape[0], step):
            yield name, r0, min(r0 + step, info.shape[0])
        if info.shape[0] == 0:
            yield name, 0, 0


def _read_band(src: Checkpoint, name: str, r0: int, r1: int) -> torch.Tensor:
    if r0 < 0:
        return src.read_raw(name)
    return src.read_rows(name, r0, r1)


def convert_fp8_to_bf16(
    src_dir: Path,
    dst_dir: Path,
    threads: int = 2,
    band_bytes: int = DEFAULT_BAND_BYTES,
    progress: bool = True,
) -> Fp8Report:
    src = Checkpoint(src_dir)
    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    report = Fp8Report()

    # plan: outputs per file, and every scale checked before anything is written
    outputs: dict[str, list[str]] = {}
    for fname in src.files:
        names = [t.name for t in src.file_tensors[fname] if not t.name.endswith(SCALE_SUFFIX)]
        outputs[fname] = names
        for n in names:
            if src.is_fp8(n):
                src.scale_info(n)
    orphans = [
        n for n in src.tensors if n.endswith(SCALE_SUFFIX) and n[: -len(SCALE_SUFFIX)] not in src.tensors
    ]
    if orphans:
        raise WeightsError(
            f"{src.root / src.info(orphans[0]).file}: scale {orphans[0]} has no weight "
            f"{orphans[0][: -len(SCALE_SUFFIX)]}; the checkpoint is incomplete"
        )

    state_path = dst_dir / STATE_NAME
    fingerprint = _source_fingerprint(src)
    state: dict = {"source": str(src.root.resolve()), "source_files": fingerprint, "done": []}
    if state_path.is_file():
        old = json.loads(state_path.read_text())
        if old.get("source_files") != fingerprint:
            raise WeightsError(
                f"{state_path}: an earlier run converted a different source into {dst_dir}; "
                "use an empty output directory (or delete this one yourself)"
            )
        state["done"] = old.get("done", [])
    elif any(dst_dir.glob("*.safetensors")):
        raise WeightsError(
            f"{dst_dir}: already holds .safetensors files not written by this tool; use an empty directory"
        )
    atomic.write_json(state_path, state)

    total = sum(_out_bytes(src, n) for v in outputs.values() for n in v)
    weight_map: dict[str, str] = {}
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="fp8->bf16", disable=not progress)
    state_lock = threading.Lock()

    def finish(tmp: Path, out_path: Path, fname: str) -> None:
        # fsync + rename + record, in the background: the disk flushes one shard while the next is computed
        atomic.commit(tmp, out_path)
        with state_lock:
            state["done"] = sorted({*state["done"], fname})
            atomic.write_json(state_path, state)
            report.files_written.append(fname)

    finisher = ThreadPoolExecutor(max_workers=1)
    finishing: list[Future] = []
    try:
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            for fname, names in outputs.items():
                for n in names:
                    weight_map[n] = fname
                fbytes = sum(_out_bytes(src, n) for n in names)
                out_path = dst_dir / fname
                if fname in state["done"] and out_path.is_file():
                    report.files_skipped.append(fname)
                    bar.update(fbytes)
                    continue
                layout = [(n, src.out_dtype(n), src.info(n).shape) for n in names]
                tmp = atomic.tmp_path_for(out_path)
                writer = StreamingWriter(tmp, layout, metadata={"format": "pt"})
                try:
                    inflight: collections.deque[tuple[str, Future]] = collections.deque()
                    for name, r0, r1 in _bands(src, names, band_bytes):
                        inflight.append((name, pool.submit(_read_band, src, name, r0, r1)))
                        if len(inflight) > 2 * max(1, threads):
                            _drain_one(inflight, writer, bar)
                    while inflight:
                        _drain_one(inflight, writer, bar)
                    writer.close(sync=False)
                except BaseException:
                    writer.abort()
                    tmp.unlink(missing_ok=True)
                    raise
                finishing.append(finisher.submit(finish, tmp, out_path, fname))
        for f in finishing:
            f.result()
    finally:
        finisher.shutdown(wait=True)
    bar.close()
    for names in outputs.values():
        for n in names:
            if src.is_fp8(n):
                report.dequantised += 1
            else:
                report.copied += 1

    report.total_size = sum(_out_bytes(src, n) for v in outputs.values() for n in v)
    index = {"metadata": {"total_size": report.total_size}, "weight_map": dict(sorted(weight_map.items()))}
    atomic.write_json(dst_dir / INDEX_NAME, index)
    report.config_changes, report.copied_files = copy_side_files(src.root, dst_dir)
    return report


def _drain_one(inflight: collections.deque, writer: StreamingWriter, bar: tqdm) -> None:
    name, fut = inflight.popleft()
    t = fut.result()
    writer.write(name, t)
    bar.update(t.numel() * t.element_size())


def _out_bytes(src: Checkpoint, name: str) -> int:
    info = src.info(name)
    n = 1
    for d in info.shape:
        n *= d
    return n * src.out_dtype(name).itemsize


def copy_side_files(src_dir: Path, dst_dir: Path) -> tuple[list[str], list[str]]:
    """Copy tokenizer, generation config and other small files; config.json goes through the fix-up."""
    changes: list[str] = []
    copied: list[str] = []
    for p in sorted(Path(src_dir).iterdir()):
        if not p.is_file() or p.suffix == ".safetensors" or p.name in (INDEX_NAME, STATE_NAME):
            continue
        if p.name.endswith(atomic.TMP_SUFFIX):
            continue
        if p.name == "config.json":
            changes = hf_config.fix_config_file(p, dst_dir / "config.json")
        else:
            atomic.copy_file(p, dst_dir / p.name)
        copied.append(p.name)
    return changes, copied
