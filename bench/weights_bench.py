"""Benchmark of the weight tools on synthetic DeepSeek-V3-shaped checkpoints, against a plain copy.

    python bench/weights_bench.py [--layers-small 2 --layers-large 10] [--keep DIR]

For two model sizes (at least 4x apart; the large one at least 2 GB of FP8), in one temporary
directory that is removed at the end:
  1. makes the FP8 checkpoint (random bytes in DeepSeek-V3 structure: MLA, dense + MoE layers, shared
     expert, router bias, scales), plus its tokenizer/config files;
  2. copy baseline: reads and writes the same files with plain buffered I/O and fsync, in this script;
  3. runs `python -m tools.weights fp8-to-bf16`, `hf-to-mcore` (from BF16 and straight from FP8) and
     `mcore-to-hf` as subprocesses, sampling their anonymous RSS (RssAnon in /proc/<pid>/status);
  4. (large size) kills fp8-to-bf16 and hf-to-mcore with SIGKILL half way, restarts them, and compares
     the output byte for byte with the uninterrupted run.
Throughput counts bytes read + bytes written per second, for the copy and the tools alike.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.weights import synthetic  # noqa: E402


def bench_config(layers: int) -> dict:
    """DeepSeek-V3 structure at a width that makes one MoE layer about 0.2 GB of FP8."""
    return synthetic.tiny_config(
        vocab_size=8000,
        hidden_size=2048,
        intermediate_size=5632,
        moe_intermediate_size=512,
        num_hidden_layers=layers,
        first_k_dense_replace=1,
        num_attention_heads=16,
        num_key_value_heads=16,
        q_lora_rank=768,
        kv_lora_rank=256,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=64,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        max_position_embeddings=4096,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    )  # fmt: skip


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


def copy_baseline(src: Path, dst: Path, buf: int = 16 << 20) -> float:
    """Plain read-and-write of every file of `src`, fsync per file. Returns seconds."""
    dst.mkdir()
    t0 = time.perf_counter()
    for p in sorted(src.iterdir()):
        with open(p, "rb") as fi, open(dst / p.name, "wb") as fo:
            while chunk := fi.read(buf):
                fo.write(chunk)
            fo.flush()
            os.fsync(fo.fileno())
    return time.perf_counter() - t0


def rss_anon(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def run_tool(args: list[str], kill_when=None) -> tuple[float, int, int]:
    """Run `python -m tools.weights ARGS`; returns (seconds, peak RssAnon bytes, return code).

    `kill_when()`: polled while running; when it returns True the process gets SIGKILL.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "tools.weights", *args], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    peak = 0
    while p.poll() is None:
        peak = max(peak, rss_anon(p.pid))
        if kill_when is not None and kill_when():
            p.send_signal(signal.SIGKILL)
            p.wait()
            break
        time.sleep(0.02)
    out = p.stdout.read() if p.stdout else ""
    if p.returncode not in (0, -signal.SIGKILL):
        raise SystemExit(f"tools.weights {' '.join(args)} failed ({p.returncode}):\n{out}")
    return time.perf_counter() - t0, peak, p.returncode


def same_tree(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def mibs(n: float, t: float) -> str:
    return f"{n / t / (1 << 20):7.0f} MiB/s"


def bench_size(root: Path, layers: int, resume_check: bool) -> dict:
    root.mkdir()
    cfg = bench_config(layers)
    fp8, bf16 = root / "fp8", root / "bf16"
    t0 = time.perf_counter()
    synthetic.write_checkpoint(fp8, cfg, fp8=True, shard_bytes=256 << 20, fast=True)
    gen = time.perf_counter() - t0
    fp8_b = dir_bytes(fp8)
    print(f"\n== {layers} layers: FP8 checkpoint {gib(fp8_b)} in {len(list(fp8.glob('*.safetensors')))} shards "
          f"(made in {gen:.0f} s)")  # fmt: skip
    r: dict = {"layers": layers, "fp8_bytes": fp8_b}

    t_copy_fp8 = copy_baseline(fp8, root / "copy_fp8")
    shutil.rmtree(root / "copy_fp8")
    t, peak, _ = run_tool(["fp8-to-bf16", str(fp8), str(bf16)])
    bf16_b = dir_bytes(bf16)
    r["fp8_to_bf16"] = {"s": t, "peak": peak, "copy_s": t_copy_fp8,
                        "ratio": ((fp8_b + bf16_b) / t) / ((2 * fp8_b) / t_copy_fp8)}  # fmt: skip
    print(f"copy baseline (FP8 files)   {mibs(2 * fp8_b, t_copy_fp8)}  ({t_copy_fp8:.1f} s)")
    print(f"fp8-to-bf16                 {mibs(fp8_b + bf16_b, t)}  ({t:.1f} s)  ratio {r['fp8_to_bf16']['ratio']:.2f}"
          f"  peak RssAnon {peak / (1 << 20):.0f} MiB")  # fmt: skip

    t_copy_bf16 = copy_baseline(bf16, root / "copy_bf16")
    shutil.rmtree(root / "copy_bf16")
    mc = root / "mc"
    t, peak, _ = run_tool(["hf-to-mcore", str(bf16), str(mc)])
    mc_b = dir_bytes(mc)
    r["hf_to_mcore"] = {"s": t, "peak": peak, "copy_s": t_copy_bf16,
                        "ratio": ((bf16_b + mc_b) / t) / ((2 * bf16_b) / t_copy_bf16)}  # fmt: skip
    print(f"copy baseline (BF16 files)  {mibs(2 * bf16_b, t_copy_bf16)}  ({t_copy_bf16:.1f} s)")
    print(f"hf-to-mcore (from BF16)     {mibs(bf16_b + mc_b, t)}  ({t:.1f} s)  ratio {r['hf_to_mcore']['ratio']:.2f}"
          f"  peak RssAnon {peak / (1 << 20):.0f} MiB")  # fmt: skip

    mc8 = root / "mc_from_fp8"
    t, peak, _ = run_tool(["hf-to-mcore", str(fp8), str(mc8)])
    r["fp8_to_mcore"] = {"s": t, "peak": peak, "ratio": ((fp8_b + mc_b) / t) / ((2 * fp8_b) / t_copy_fp8),
                         "identical": same_tree_except(mc, mc8, {"hf-to-mcore.state.json"})}  # fmt: skip
    print(f"hf-to-mcore (from FP8)      {mibs(fp8_b + mc_b, t)}  ({t:.1f} s)  ratio {r['fp8_to_mcore']['ratio']:.2f}"
          f" vs FP8 copy  peak RssAnon {peak / (1 << 20):.0f} MiB  same bytes as from BF16: "
          f"{r['fp8_to_mcore']['identical']}")  # fmt: skip
    shutil.rmtree(mc8)

    out = root / "export"
    t, peak, _ = run_tool(["mcore-to-hf", str(mc), str(out), "--config", str(bf16)])
    r["mcore_to_hf"] = {"s": t, "peak": peak, "ratio": ((mc_b + bf16_b) / t) / ((2 * bf16_b) / t_copy_bf16)}
    print(f"mcore-to-hf                 {mibs(mc_b + bf16_b, t)}  ({t:.1f} s)  ratio {r['mcore_to_hf']['ratio']:.2f}"
          f"  peak RssAnon {peak / (1 << 20):.0f} MiB")  # fmt: skip
    shutil.rmtree(out)

    if resume_check:
        r["resume"] = {}
        for name, args, ref, marker in (
            ("fp8-to-bf16", ["fp8-to-bf16", str(fp8)], bf16, "*.safetensors"),
            ("hf-to-mcore", ["hf-to-mcore", str(bf16)], mc, "*.distcp"),
        ):
            dst = root / f"killed_{name}"
            half = len(list(ref.glob(marker))) // 2
            _, _, rc = run_tool(
                [*args, str(dst)], kill_when=lambda d=dst, h=half, m=marker: len(list(d.glob(m))) >= h
            )
            done_at_kill = len(list(dst.glob(marker)))
            run_tool([*args, str(dst)])
            same = same_tree(ref, dst)
            r["resume"][name] = {
                "killed": rc == -signal.SIGKILL,
                "files_at_kill": done_at_kill,
                "identical": same,
            }
            print(f"SIGKILL {name}: killed={rc == -signal.SIGKILL} with {done_at_kill}/{len(list(ref.glob(marker)))} "
                  f"files done; restarted output byte-identical to uninterrupted run: {same}")  # fmt: skip
            shutil.rmtree(dst)
    shutil.rmtree(root)
    return r


def same_tree_except(a: Path, b: Path, skip: set[str]) -> bool:
    names = sorted(p.name for p in a.iterdir() if p.name not in skip)
    if names != sorted(p.name for p in b.iterdir() if p.name not in skip):
        return False
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers-small", type=int, default=2)
    ap.add_argument("--layers-large", type=int, default=12)
    ap.add_argument("--tmp", default=None, help="parent of the temporary directory (needs ~20 GB free)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="weights-bench-", dir=a.tmp))
    try:
        small = bench_size(tmp / "small", a.layers_small, resume_check=False)
        large = bench_size(tmp / "large", a.layers_large, resume_check=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print("\n== summary")
    print(f"sizes: {gib(small['fp8_bytes'])} and {gib(large['fp8_bytes'])} of FP8 "
          f"({large['fp8_bytes'] / small['fp8_bytes']:.1f}x)")  # fmt: skip
    ok = True
    for key, target, label in (("fp8_to_bf16", 0.7, "FP8 -> BF16"), ("hf_to_mcore", 0.5, "HF -> Megatron")):
        ratio = large[key]["ratio"]
        ok &= ratio >= target
        print(f"{label:15s} throughput / copy baseline: {ratio:.2f} (target >= {target})")
    for key in ("fp8_to_bf16", "hf_to_mcore", "fp8_to_mcore", "mcore_to_hf"):
        ps, pl = small[key]["peak"], large[key]["peak"]
        ok &= pl <= 1 << 30
        print(f"peak RssAnon {key:12s}: {ps / (1 << 20):5.0f} MiB (small)  {pl / (1 << 20):5.0f} MiB (large)  "
              f"(target <= 1024 MiB, flat)")  # fmt: skip
    for name, res in large["resume"].items():
        ok &= res["identical"] and res["killed"]
        print(f"SIGKILL half way + restart, {name}: byte-identical = {res['identical']}")
    print("all targets met" if ok else "SOME TARGETS MISSED")
    if a.json:
        Path(a.json).write_text(json.dumps({"small": small, "large": large}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
