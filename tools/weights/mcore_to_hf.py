"""Megatron-core `torch_dist` checkpoint -> Hugging Face safetensors shards + index, bounded memory.

The same layout plan as the import (mcore_plan.plan_layout, from the HF config.json) says where each
HF tensor lives inside the Megatron tensors. Each HF tensor is assembled band by band from whichever
stored chunks overlap it (any TP/PP/EP layout the checkpoint was saved with), reading only the rows
needed from each chunk (dcp_chunks). Shards are written by the streaming safetensors writer, each to
`.partial` and renamed; the index carries `total_size`; config.json (fixed up) and tokenizer files
are copied from the HF directory given with --config.

The output folder is written whole or not at all: everything goes into `<dst>.partial` beside it, renamed
to `<dst>` at the end (a failure removes it). Before anything is written, every file the checkpoint's
.metadata names is checked to exist and to hold the bytes it should (a truncated `.distcp` is one line
naming it). The layer spec (the key names of megatron-core's Transformer-Engine spec or of its local spec,
which `make train` on CPU uses) is read from the checkpoint's own keys unless given.
"""

from __future__ import annotations

import collections
import contextlib
import io
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata
from tqdm import tqdm

from tools import atomic
from tools.weights.dcp_chunks import ChunkLayout, chunk_layout, read_block
from tools.weights.errors import WeightsError
from tools.weights.fp8_to_bf16 import copy_side_files
from tools.weights.hf_config import read_config
from tools.weights.mcore_plan import Source, plan_layout
from tools.weights.safetensors_index import INDEX_NAME, band_rows
from tools.weights.safetensors_writer import StreamingWriter

DEFAULT_SHARD_BYTES = 4 << 30
DEFAULT_BAND_BYTES = 32 << 20


@dataclass
class ExportReport:
    tensors: int
    files: int
    total_size: int


class _Chunks:
    """The stored chunks of one checkpoint, with their byte layouts parsed once."""

    def __init__(self, root: Path):
        self.root = Path(root)
        if not (self.root / ".metadata").is_file():
            raise WeightsError(
                f"{self.root}: no .metadata; point at a Megatron torch_dist checkpoint directory"
            )
        try:
            self.md = FileSystemReader(str(self.root)).read_metadata()
        except Exception as e:  # a corrupt pickle can raise anything
            raise WeightsError(
                f"{self.root / '.metadata'}: cannot be read ({e}); the checkpoint is damaged"
            ) from e
        self._layouts: dict[tuple[str, int], ChunkLayout | None] = {}
        self._lock = threading.Lock()

    def check_files(self) -> None:
        """Every stored item's file exists and is long enough for it (a truncated .distcp: named)."""
        need: dict[str, tuple[int, str]] = {}
        for index, info in self.md.storage_data.items():
            end = info.offset + info.length
            if end > need.get(info.relative_path, (-1, ""))[0]:
                need[info.relative_path] = (end, index.fqn)
        for rel, (end, key) in sorted(need.items()):
            path = self.root / rel
            if not path.is_file():
                raise WeightsError(f"{path}: missing (holds chunks of {key}); the checkpoint is incomplete")
            size = path.stat().st_size
            if size < end:
                raise WeightsError(
                    f"{path}: truncated: {size} bytes, the checkpoint's .metadata needs at least {end} "
                    f"(chunks of {key}); copy the checkpoint again or export an earlier one"
                )

    def layer_spec(self) -> str | None:
        """'local' or 'te' from the key names stored (None: neither kind of norm key found)."""
        keys = self.md.state_dict_metadata
        if any(k.endswith((".kv_layernorm.weight", ".q_layernorm.weight")) for k in keys):
            return "local"
        if any(k.endswith(".layer_norm_weight") for k in keys):
            return "te"
        return None

    def tensor(self, key: str) -> TensorStorageMetadata:
        m = self.md.state_dict_metadata.get(key)
        if not isinstance(m, TensorStorageMetadata):
            raise WeightsError(
                f"{self.root}: tensor {key} not in the checkpoint; was it written for the model that "
                "--config describes?"
            )
        return m

    def read(self, key: str, chunk, index: tuple[int, ...], row_axis: int, r0: int, r1: int) -> torch.Tensor:
        info = self.md.storage_data[MetadataIndex(key, chunk.offsets)]
        path = self.root / info.relative_path
        if not path.is_file():
            raise WeightsError(f"{path}: missing (holds chunks of {key}); the checkpoint is incomplete")
        with self._lock:
            k = (str(path), info.offset)
            if k not in self._layouts:
                self._layouts[k] = chunk_layout(path, info.offset, info.length)
            layout = self._layouts[k]
        if layout is not None:
            return read_block(path, layout, row_axis, index, r0, r1)
        with open(path, "rb") as f:  # not a plain contiguous chunk: load this one chunk whole
            f.seek(info.offset)
            t = torch.load(io.BytesIO(f.read(info.length)), map_location="cpu", weights_only=True)
        return t[index][r0:r1].clone()


def model_checkpoint(src: Path) -> Path:
    """The torch_dist folder of the model in `src`: src itself, or, for a verl checkpoint folder
    (`checkpoints/global_step_N` or its `actor/`), `actor/model/dist_ckpt` (verl 0.9.1, the current stack) or
    `actor/dist_ckpt` (verl 0.6.0, published)."""
    if (src / ".metadata").is_file():
        return src
    for rel in ("actor/model/dist_ckpt", "actor/dist_ckpt", "model/dist_ckpt", "dist_ckpt"):
        if (src / rel / ".metadata").is_file():
            return src / rel
    return src


def _assemble(chunks: _Chunks, src: Source, dtype: torch.dtype, r0: int, r1: int) -> torch.Tensor:
    """Rows [r0, r1) of HF tensor `src` from the chunks that overlap them."""
    m = chunks.tensor(src.key)
    lead, ax = src.lead, len(src.lead)
    rows0, rows1 = src.row_offset + r0, src.row_offset + r1
    rest = src.hf_shape[1:]
    out = torch.empty(r1 - r0, *rest, dtype=dtype)
    filled = 0
    for c in m.chunks:
        o, s = tuple(c.offsets), tuple(c.sizes)
        if any(not (o[i] <= lead[i] < o[i] + s[i]) for i in range(ax)):
            continue
        a, b = max(rows0, o[ax]), min(rows1, o[ax] + s[ax])
        if a >= b:
            continue
        block = chunks.read(src.key, c, tuple(lead[i] - o[i] for i in range(ax)), ax, a - o[ax], b - o[ax])
        dst = out[a - rows0 : b - rows0]
        if rest:
            dst = dst[:, o[ax + 1] : o[ax + 1] + s[ax + 1]]
        dst.copy_(block.reshape(dst.shape))
        filled += block.numel()
    if filled != out.numel():
        raise WeightsError(
            f"{chunks.root}: tensor {src.key} has stored chunks covering {filled} of the {out.numel()} "
            f"elements that {src.hf_name} rows {r0}:{r1} need; the checkpoint is incomplete"
        )
    return out


def export_mcore_to_hf(
    src_dir: Path,
    config_dir: Path,
    dst_dir: Path,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    threads: int = 2,
    band_bytes: int = DEFAULT_BAND_BYTES,
    progress: bool = True,
    layer_spec: str | None = None,
) -> ExportReport:
    """Export; layer_spec None: read from the checkpoint's key names (te when it cannot tell)."""
    dst_dir = Path(dst_dir)
    if dst_dir.exists() and (not dst_dir.is_dir() or any(dst_dir.iterdir())):
        raise WeightsError(
            f"{dst_dir}: exists and is not an empty folder; the export writes a new folder",
            fix="remove it or name another DST",
        )
    cfg = read_config(config_dir)
    chunks = _Chunks(model_checkpoint(Path(src_dir)))
    chunks.check_files()
    tensors, _ = plan_layout(cfg, layer_spec or chunks.layer_spec() or "te")
    outputs: list[tuple[Source, torch.dtype]] = []
    for t in tensors.values():
        m = chunks.tensor(t.key)
        if tuple(m.size) != t.shape:
            raise WeightsError(
                f"{chunks.root}: tensor {t.key} has shape {list(m.size)}, {config_dir}/config.json implies "
                f"{list(t.shape)}; pass the config of the model this checkpoint was trained from"
            )
        outputs += [(s, m.properties.dtype) for s in t.sources]

    files: list[list[tuple[Source, torch.dtype]]] = [[]]
    size = 0
    for s, dtype in outputs:
        n = _numel(s.hf_shape) * dtype.itemsize
        if files[-1] and size + n > shard_bytes:
            files.append([])
            size = 0
        files[-1].append((s, dtype))
        size += n
    final_dir = dst_dir
    dst_dir = final_dir.with_name(final_dir.name + atomic.TMP_SUFFIX)
    if dst_dir.exists():
        shutil.rmtree(dst_dir)  # an earlier export's leftover: ours
    dst_dir.mkdir(parents=True)
    try:
        report = _write(chunks, files, outputs, dst_dir, Path(config_dir), threads, band_bytes, progress)
        if final_dir.exists():
            final_dir.rmdir()  # empty (checked above)
        dst_dir.rename(final_dir)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(dst_dir)
        raise
    return report


def _write(
    chunks: _Chunks,
    files: list[list[tuple[Source, torch.dtype]]],
    outputs: list[tuple[Source, torch.dtype]],
    dst_dir: Path,
    config_dir: Path,
    threads: int,
    band_bytes: int,
    progress: bool,
) -> ExportReport:
    total = sum(_numel(s.hf_shape) * d.itemsize for s, d in outputs)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="mcore->hf", disable=not progress)
    weight_map: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for k, items in enumerate(files):
            fname = f"model-{k + 1:05d}-of-{len(files):05d}.safetensors"
            layout = [(s.hf_name, d, s.hf_shape) for s, d in items]
            with atomic.atomic_path(dst_dir / fname) as tmp:
                writer = StreamingWriter(tmp, layout, metadata={"format": "pt"})
                try:
                    inflight: collections.deque = collections.deque()
                    for s, d in items:
                        weight_map[s.hf_name] = fname
                        step = band_rows(s.hf_shape, d.itemsize, band_bytes)
                        for r0 in range(0, s.hf_shape[0], step):
                            r1 = min(r0 + step, s.hf_shape[0])
                            inflight.append((s.hf_name, pool.submit(_assemble, chunks, s, d, r0, r1)))
                            if len(inflight) > 2 * max(1, threads):
                                _drain(inflight, writer, bar)
                    while inflight:
                        _drain(inflight, writer, bar)
                    writer.close()
                except BaseException:
                    writer.abort()
                    raise
    bar.close()
    atomic.write_json(
        dst_dir / INDEX_NAME,
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )
    copy_side_files(Path(config_dir), dst_dir)
    return ExportReport(tensors=len(outputs), files=len(files), total_size=total)


def _drain(inflight: collections.deque, writer: StreamingWriter, bar: tqdm) -> None:
    name, fut = inflight.popleft()
    t = fut.result()
    writer.write(name, t)
    bar.update(t.numel() * t.element_size())


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
