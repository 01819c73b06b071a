"""Block-wise FP8 (float8_e4m3fn, 128x128 blocks) dequantisation to BF16, exact, on CPU.

`W[i, j] = float(q[i, j]) * scale_inv[i // 128, j // 128]` in fp32, stored as bf16. Edge blocks
(rows or columns not a multiple of 128) are partial.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 128
# the float32 value of each of the 256 float8_e4m3fn bit patterns (NaN for S.1111.111)
_FP8_VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def dequantize_rows(q: torch.Tensor | np.ndarray, scale: torch.Tensor, row0: int) -> torch.Tensor:
    """Dequantise rows [row0, row0 + len(q)) of an FP8 weight.

    `scale` holds the scale rows row0 // 128 ... (last row) // 128 of the full [ceil(M/128), ceil(N/128)]
    scale tensor. `row0` must be a multiple of 128 (bands are block-aligned). `q` may also be the raw
    bytes as a uint8 numpy array (e.g. a view of the mmapped file).

    Exact and fast: FP8 has 256 values, so for each 128-row block the 256 possible BF16 results of
    every column block (fp32 product, then bf16, exactly as the reference) are tabulated and the output
    is one gather. This runs at several hundred million elements per second on one core, where a
    float8 -> float32 conversion in torch manages under 100.
    """
    if row0 % BLOCK:
        raise ValueError(f"band start {row0} is not a multiple of {BLOCK}")
    rows, cols = q.shape
    u = q if isinstance(q, np.ndarray) else q.contiguous().view(torch.uint8).numpy()
    out = np.empty((rows, cols), dtype=np.int16)
    nbc = -(-cols // BLOCK)
    idx_dtype = np.int16 if nbc * 256 <= 32768 else np.int32
    col_base = (np.arange(cols) // BLOCK * 256).astype(idx_dtype)
    idx = np.empty((min(rows, BLOCK), cols), dtype=idx_dtype)
    # tables[k, j * 256 + code]: bf16 bits of fp32(code) * scale[k, j], rounded as the reference does
    sc = scale.to(torch.float32)[:, :nbc]
    tables = (_FP8_VALUES[None, None, :] * sc[:, :, None]).to(torch.bfloat16).view(torch.int16)
    tables = tables.reshape(sc.shape[0], -1).numpy()
    for b in range(0, rows, BLOCK):
        n = min(BLOCK, rows - b)
        np.add(u[b : b + n], col_base, out=idx[:n], dtype=idx_dtype, casting="unsafe")
        np.take(tables[b // BLOCK], idx[:n], out=out[b : b + n])
    return torch.from_numpy(out).view(torch.bfloat16)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a 2-D float tensor into FP8 with per-block scales (used to make test and bench models)."""
    m, n = w.shape
    bm, bn = -(-m // BLOCK), -(-n // BLOCK)
    pad = torch.zeros(bm * BLOCK, bn * BLOCK, dtype=torch.float32)
    pad[:m, :n] = w.float()
    blocks = pad.view(bm, BLOCK, bn, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = amax / 448.0
    q = (blocks / scale[:, None, :, None]).view(bm * BLOCK, bn * BLOCK)[:m, :n]
    return q.to(torch.float8_e4m3fn), scale.to(torch.float32)
