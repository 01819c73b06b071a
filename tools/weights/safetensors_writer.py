"""Streaming safetensors writer: the header is computed from the planned shapes, then the tensors'
bytes are appended band by band, so a multi-GB shard never has to be in memory.

(`safetensors.torch.save_file` needs every tensor of the file in memory at once.) The output is a
standard safetensors file; the tests read it back with `safetensors.safe_open`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

from tools.weights.safetensors_index import DTYPE_NAMES


class StreamingWriter:
    """Write tensors in the declared order; each tensor's bytes may come in several pieces."""

    def __init__(
        self,
        path: Path,
        tensors: list[tuple[str, torch.dtype, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
    ):
        self.path = Path(path)
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = metadata
        offset = 0
        self._sizes: list[tuple[str, int]] = []
        for name, dtype, shape in tensors:
            nbytes = math.prod(shape) * dtype.itemsize
            header[name] = {
                "dtype": DTYPE_NAMES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            self._sizes.append((name, nbytes))
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # data section 8-byte aligned, as safetensors writes it
        self.data_bytes = offset
        self._f = open(self.path, "wb")  # noqa: SIM115 (closed by close() or abort())
        self._f.write(struct.pack("<Q", len(raw)))
        self._f.write(raw)
        self._i = 0
        self._left = self._sizes[0][1] if self._sizes else 0

    def write(self, name: str, piece: torch.Tensor) -> None:
        """Append the next bytes of tensor `name` (must be the current tensor, contiguous pieces in order)."""
        while self._i < len(self._sizes) and self._left == 0:
            self._advance()
        if self._i >= len(self._sizes) or self._sizes[self._i][0] != name:
            expected = self._sizes[self._i][0] if self._i < len(self._sizes) else "nothing more"
            raise RuntimeError(f"{self.path}: got bytes of {name}, expected {expected}")
        data = piece.contiguous().view(torch.uint8).numpy() if piece.numel() else b""
        n = len(data) if isinstance(data, bytes) else data.nbytes
        if n > self._left:
            raise RuntimeError(f"{self.path}: tensor {name} gets {n} bytes, only {self._left} left")
        self._f.write(data)
        self._left -= n

    def _advance(self) -> None:
        self._i += 1
        self._left = self._sizes[self._i][1] if self._i < len(self._sizes) else 0

    def close(self, sync: bool = True) -> None:
        """Finish the file (every declared byte must have been written); fsync unless `sync=False`."""
        while self._i < len(self._sizes) and self._left == 0:
            self._advance()
        if self._i < len(self._sizes):
            self._f.close()
            raise RuntimeError(f"{self.path}: tensor {self._sizes[self._i][0]} incomplete at close")
        self._f.flush()
        if sync:
            os.fsync(self._f.fileno())
        self._f.close()

    def abort(self) -> None:
        self._f.close()
