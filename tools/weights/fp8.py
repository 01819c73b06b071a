"""Block-wise FP8 (float8_e4m3fn, 128x128 blocks) dequantisation to BF16, exact, on CPU.

`W[i, j] = float(q[i, j]) * scale_inv[i // 128, j // 128]` in fp32, stored as bf16. Edge blocks
(rows or columns not a multiple of 128) are partial.
"""

from __future__ import annotations

import torch

BLOCK = 128


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, row0: int) -> torch.Tensor:
    """Dequantise rows [row0, row0 + len(q)) of an FP8 weight.

    `scale` holds the scale rows row0 // 128 ... (last row) // 128 of the full [ceil(M/128), ceil(N/128)]
    scale tensor. `row0` must be a multiple of 128 (bands are block-aligned).
    """
    if row0 % BLOCK:
        raise ValueError(f"band start {row0} is not a multiple of {BLOCK}")
    rows, cols = q.shape
    out = torch.empty(rows, cols, dtype=torch.bfloat16)
    scale = scale.to(torch.float32)
    for b in range(0, rows, BLOCK):  # one block row at a time: fp32 temporaries stay small
        s = scale[b // BLOCK].repeat_interleave(BLOCK)[:cols]
        out[b : b + BLOCK] = (q[b : b + BLOCK].to(torch.float32) * s).to(torch.bfloat16)
    return out


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
