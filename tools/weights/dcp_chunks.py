"""Reading rows of one chunk of a torch_dist checkpoint without loading the whole chunk.

torch's FileSystemWriter (and ours) stores each chunk as a `torch.save` zip at an offset inside a
`.distcp` file. The zip stores the tensor bytes uncompressed, so the rows a caller needs can be read
with one seek: the zip and its pickled header (shape, stride, dtype) are parsed here without
unpickling any tensor data. A chunk whose layout is not a plain contiguous tensor falls back to
`torch.load` of that one chunk.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

_STORAGE_DTYPES = {
    "BFloat16Storage": torch.bfloat16,
    "HalfStorage": torch.float16,
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}


class _Window:
    """A read-only, seekable view of bytes [start, start + length) of an open file (enough for zipfile)."""

    def __init__(self, f, start: int, length: int):
        self.f, self.start, self.length, self.pos = f, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = {0: pos, 1: self.pos + pos, 2: self.length + pos}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.pos if n is None or n < 0 else min(n, self.length - self.pos)
        self.f.seek(self.start + self.pos)
        data = self.f.read(n)
        self.pos += len(data)
        return data


@dataclass(frozen=True)
class _Rebuilt:
    storage: tuple
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


class _HeaderUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return lambda storage, offset, size, stride, *_: _Rebuilt(
                storage, offset, tuple(size), tuple(stride)
            )
        if module == "torch" and name in _STORAGE_DTYPES:
            return name
        if module == "collections" and name == "OrderedDict":
            import collections

            return collections.OrderedDict
        raise pickle.UnpicklingError(f"unexpected {module}.{name}")

    def persistent_load(self, pid):
        return tuple(pid)  # ('storage', storage_type, key, location, numel)


@dataclass(frozen=True)
class ChunkLayout:
    data_start: int  # absolute byte offset of the tensor's first element in the .distcp file
    shape: tuple[int, ...]
    dtype: torch.dtype


def chunk_layout(path: Path, offset: int, length: int) -> ChunkLayout | None:
    """Where a contiguous chunk's bytes are, or None when the chunk is not stored contiguously."""
    with open(path, "rb") as f:
        w = _Window(f, offset, length)
        try:
            z = zipfile.ZipFile(w)  # type: ignore[arg-type]
            pkl_name = next(n for n in z.namelist() if n.endswith("data.pkl"))
            head = _HeaderUnpickler(io.BytesIO(z.read(pkl_name))).load()
        except (zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, TypeError, ValueError):
            return None
        if not isinstance(head, _Rebuilt):
            return None
        _, stype, key, _, numel = head.storage
        dtype = _STORAGE_DTYPES[stype]
        n = 1
        for s in head.size:
            n *= s
        contiguous = tuple(torch.empty(head.size, device="meta").stride()) == head.stride
        if not contiguous or head.offset + n > numel:
            return None
        prefix = pkl_name[: -len("data.pkl")]
        info = z.getinfo(f"{prefix}data/{key}")
        if info.compress_type != zipfile.ZIP_STORED:
            return None
        w.seek(info.header_offset)
        local = w.read(30)
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        start = offset + info.header_offset + 30 + name_len + extra_len + head.offset * dtype.itemsize
        return ChunkLayout(start, head.size, dtype)


def read_block(
    path: Path, layout: ChunkLayout, row_axis: int, index: tuple[int, ...], r0: int, r1: int
) -> torch.Tensor:
    """Rows [r0, r1) along `row_axis` of the chunk, at fixed `index` on the axes before it.

    Returns a tensor of shape [r1 - r0, *shape[row_axis + 1:]] read with a single seek.
    """
    shape = layout.shape
    rest = 1
    for s in shape[row_axis + 1 :]:
        rest *= s
    lin = 0
    for i, ax in zip(index, shape[:row_axis], strict=True):
        lin = lin * ax + i
    first = (lin * shape[row_axis] + r0) * rest
    count = (r1 - r0) * rest
    item = layout.dtype.itemsize
    with open(path, "rb") as f:
        f.seek(layout.data_start + first * item)
        buf = bytearray(count * item)
        f.readinto(buf)
    t = torch.frombuffer(buf, dtype=layout.dtype) if count else torch.empty(0, dtype=layout.dtype)
    return t.reshape(r1 - r0, *shape[row_axis + 1 :])
