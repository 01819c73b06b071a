"""Reading a Hugging Face safetensors checkpoint lazily: index, headers, row bands, FP8 dequantisation.

Headers are parsed here (a few KB per file) so that shapes, dtypes and file sizes are known and
checked before any tensor is read; the tensor bytes are then read band by band through
`safetensors.safe_open` (mmap), so memory stays bounded by the band size.
"""

from __future__ import annotations

import json
import math
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from tools.weights.errors import WeightsError
from tools.weights.fp8 import BLOCK, dequantize_rows

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
SCALE_SUFFIX = "_scale_inv"

DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: str  # file name relative to the checkpoint directory
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # byte offset of the data inside the file's data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Parse one safetensors header; check that the file is long enough for every tensor.

    Returns (tensors by name, __metadata__, size of the header including its 8-byte length).
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise WeightsError(f"{path}: truncated safetensors file ({size} bytes); download it again")
            (n,) = struct.unpack("<Q", raw)
            if n > 100_000_000 or 8 + n > size:
                raise WeightsError(
                    f"{path}: truncated or corrupt safetensors header (says {n} bytes, file has {size}); "
                    "download the file again"
                )
            header = json.loads(f.read(n))
    except OSError as e:
        raise WeightsError(f"{path}: cannot read ({e.strerror}); check the path and permissions") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WeightsError(f"{path}: corrupt safetensors header ({e}); download the file again") from e
    meta = header.pop("__metadata__", {}) or {}
    tensors: dict[str, TensorInfo] = {}
    data_end = 0
    for name, h in header.items():
        if h["dtype"] not in DTYPES:
            raise WeightsError(f"{path}: tensor {name} has unsupported dtype {h['dtype']}")
        start, end = h["data_offsets"]
        dtype = DTYPES[h["dtype"]]
        shape = tuple(h["shape"])
        if end - start != math.prod(shape) * dtype.itemsize:
            raise WeightsError(f"{path}: tensor {name}: byte range does not match shape {shape}")
        tensors[name] = TensorInfo(name, path.name, dtype, shape, start, end)
        data_end = max(data_end, end)
    if 8 + n + data_end > size:
        raise WeightsError(
            f"{path}: truncated safetensors file: {size} bytes, the header needs {8 + n + data_end}; "
            "download or convert this file again"
        )
    return tensors, meta, 8 + n


class Checkpoint:
    """A Hugging Face checkpoint directory: every tensor's file, dtype and shape, read lazily."""

    def __init__(self, root: Path):
        self.root = Path(root)
        index_path = self.root / INDEX_NAME
        if index_path.is_file():
            try:
                weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise WeightsError(f"{index_path}: not a safetensors index ({e}); restore it") from e
            files = sorted(set(weight_map.values()))
        elif (self.root / SINGLE_NAME).is_file():
            weight_map = {}
            files = [SINGLE_NAME]
        else:
            raise WeightsError(
                f"{self.root}: neither {INDEX_NAME} nor {SINGLE_NAME} found; point at a Hugging Face "
                "safetensors checkpoint directory"
            )
        self.files = files
        self.tensors: dict[str, TensorInfo] = {}
        self.file_tensors: dict[str, list[TensorInfo]] = {}
        self._data_start: dict[str, int] = {}
        self._maps: dict[str, np.memmap] = {}
        self._maps_lock = threading.Lock()
        for fname in files:
            fpath = self.root / fname
            if not fpath.is_file():
                raise WeightsError(f"{fpath}: listed in {INDEX_NAME} but missing; download it")
            tensors, _, hsize = read_header(fpath)
            self._data_start[fname] = hsize
            self.file_tensors[fname] = sorted(tensors.values(), key=lambda t: t.start)
            for name, info in tensors.items():
                if weight_map and weight_map.get(name) != fname:
                    raise WeightsError(
                        f"{fpath}: holds tensor {name}, which {INDEX_NAME} maps to "
                        f"{weight_map.get(name)!r}; the index and the shards do not belong together"
                    )
                self.tensors[name] = info
        missing = sorted(set(weight_map) - set(self.tensors))
        if missing:
            raise WeightsError(
                f"{index_path}: {len(missing)} tensors listed but absent from their files, e.g. {missing[0]} "
                f"in {weight_map[missing[0]]}; download the shards again"
            )
        self._local = threading.local()

    # -- lookup -------------------------------------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise WeightsError(
                f"{self.root}: tensor {name} not found in the checkpoint (index and shards); "
                "the checkpoint is incomplete or is not the model the config describes"
            ) from None

    def is_fp8(self, name: str) -> bool:
        return self.info(name).dtype == torch.float8_e4m3fn

    def scale_info(self, name: str) -> TensorInfo:
        """The `<name>_scale_inv` of an FP8 weight, checked for shape [ceil(M/128), ceil(N/128)]."""
        w = self.info(name)
        sname = name + SCALE_SUFFIX
        if sname not in self.tensors:
            raise WeightsError(
                f"{self.root / w.file}: FP8 tensor {name} has no scale {sname} in any shard; "
                "the checkpoint is incomplete: download the shard that holds it"
            )
        s = self.tensors[sname]
        if len(w.shape) != 2:
            raise WeightsError(f"{self.root / w.file}: FP8 tensor {name} has shape {w.shape}; expected 2-D")
        want = (math.ceil(w.shape[0] / BLOCK), math.ceil(w.shape[1] / BLOCK))
        if s.shape != want:
            raise WeightsError(
                f"{self.root / s.file}: scale {sname} has shape {list(s.shape)}, expected {list(want)} "
                f"for weight {name} {list(w.shape)} (128x128 blocks, edge blocks partial)"
            )
        return s

    def out_dtype(self, name: str) -> torch.dtype:
        """dtype of the tensor as the converters write it: FP8 becomes BF16, everything else stays."""
        return torch.bfloat16 if self.is_fp8(name) else self.info(name).dtype

    # -- reading ------------------------------------------------------------------------------------
    def _handle(self, fname: str):
        handles = getattr(self._local, "handles", None)
        if handles is None:
            handles = self._local.handles = {}
        h = handles.get(fname)
        if h is None:
            h = handles[fname] = safe_open(str(self.root / fname), framework="pt")
        return h

    def raw_bytes(self, name: str, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) of a tensor as a read-only uint8 view of the mmapped file (no copy)."""
        info = self.info(name)
        with self._maps_lock:
            m = self._maps.get(info.file)
            if m is None:
                m = self._maps[info.file] = np.memmap(self.root / info.file, dtype=np.uint8, mode="r")
        row = math.prod(info.shape[1:]) * info.dtype.itemsize
        base = self._data_start[info.file] + info.start
        return m[base + r0 * row : base + r1 * row]

    def read_raw(self, name: str, r0: int | None = None, r1: int | None = None) -> torch.Tensor:
        """Rows [r0, r1) of a tensor as stored (a copy; the file is mmapped)."""
        info = self.info(name)
        sl = self._handle(info.file).get_slice(name)
        if r0 is None:
            return sl[:] if info.shape else self._handle(info.file).get_tensor(name)
        return sl[r0:r1]

    def read_rows(self, name: str, r0: int, r1: int) -> torch.Tensor:
        """Rows [r0, r1) as written by the converters: FP8 weights dequantised to BF16."""
        if not self.is_fp8(name):
            return self.read_raw(name, r0, r1)
        s = self.scale_info(name)
        cols = self.info(name).shape[1]
        band = self.raw_bytes(name, r0, r1).reshape(r1 - r0, cols)  # straight from the page cache
        scale = self.read_raw(s.name, r0 // BLOCK, math.ceil(r1 / BLOCK)).to(torch.float32)
        return dequantize_rows(band, scale, r0)

    def read(self, name: str) -> torch.Tensor:
        info = self.info(name)
        if not info.shape:
            return self.read_raw(name)
        return self.read_rows(name, 0, info.shape[0])

    def close(self) -> None:
        self._local = threading.local()


def band_rows(shape: tuple[int, ...], itemsize: int, band_bytes: int, align: int = BLOCK) -> int:
    """Rows per band so that a band is at most `band_bytes` (at least `align` rows, a multiple of it)."""
    if not shape:
        return 1
    row = math.prod(shape[1:]) * itemsize
    rows = max(1, band_bytes // max(row, 1))
    if rows >= shape[0]:
        return shape[0]
    return max(align, rows // align * align)
