"""The CPU hardware group's figures for the step-time model (tools/plan/hardware.py CPU): matmul
FLOP/s (fp32 and bf16, as torch runs them here) and memory bandwidth (a large tensor copy), measured on
this machine. Prints the numbers; hardware.py keeps the ones measured when it was written (it says where).

    .venv-current-cpu/bin/python bench/plan_cpu_figures.py
"""

from __future__ import annotations

import platform
import time

import torch


def best_of(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    n = 2048
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        t = best_of(lambda a=a, b=b: a @ b)
        print(f"matmul {dtype}: {2 * n**3 / t / 1e9:.1f} GFLOP/s ({n}x{n}, best of 5)")
    x = torch.empty(256 * 2**20 // 4)
    y = torch.empty_like(x)
    t = best_of(lambda: y.copy_(x))
    print(f"memory copy: {2 * x.numel() * 4 / t / 1e9:.1f} GB/s (read + write of 256 MiB)")
    print(f"threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}")


if __name__ == "__main__":
    main()
