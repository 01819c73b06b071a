"""Benchmark of the weight tools on synthetic DeepSeek-V3-shaped checkpoints, against a plain copy.

    python bench/weights_bench.py [--layers-small 2 --layers-large 10] [--keep DIR]

For two model sizes (at least 4x apart; the large one at least 2 GB of FP8), in one temporary
directory that is removed at the end:
  1. makes the FP8 checkpoint (random bytes in DeepSeek-V3 structure: MLA, dense + MoE layers, shared
     expert, router bias, scales), plus its tokenizer/config files;
  2. copy baseline: reads and writes the same files with plain I/O, then fsyncs them, in this script,
     alternating with the tool under test (3 times at the large size; medians compared);
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
import statistics
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
    """Plain read-and-write of every file of `src` through one reused buffer, then fsync of every
    written file (like `cp -r` followed by a sync of those files: writeback overlaps the copy).
    Returns seconds."""
    dst.mkdir()
    mem = bytearray(buf)
    view = memoryview(mem)
    t0 = time.perf_counter()
    for p in sorted(src.iterdir()):
        with open(p, "rb", buffering=0) as fi, open(dst / p.name, "wb", buffering=0) as fo:
            while n := fi.readinto(mem):
                fo.write(view[:n])
    for p in sorted(dst.iterdir()):
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t0


def warm(src: Path, buf: int = 16 << 20) -> None:
    """Read every file once (untimed) so that the copy and the tool both start from a warm page cache."""
    mem = bytearray(buf)
    for p in sorted(src.iterdir()):
        with open(p, "rb", buffering=0) as f:
            while f.readinto(mem):
                pass


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


def measure(src: Path, args: list[str], dst: Path, out_bytes, repeats: int, scratch: Path) -> dict:
    """Alternate a plain copy of `src` and the tool (src -> dst) `repeats` times; medians of each.

    The machine is shared, so single timings are noisy: alternating and taking medians compares the
    two under the same conditions; the source is read once before each timed run so both start from a
    warm page cache. The last run's output is kept in `dst`.
    """
    copies, runs, peaks = [], [], []
    in_b = dir_bytes(src)
    for _ in range(repeats):
        warm(src)
        copies.append(copy_baseline(src, scratch))
        shutil.rmtree(scratch)
        if dst.exists():
            shutil.rmtree(dst)
        warm(src)
        t, peak, _ = run_tool([*args, str(dst)])
        runs.append(t)
        peaks.append(peak)
    tc, t = statistics.median(copies), statistics.median(runs)
    moved = in_b + out_bytes(dst)
    return {"s": t, "copy_s": tc, "peak": max(peaks), "runs": runs, "copies": copies,
            "ratio": (moved / t) / (2 * in_b / tc), "tool_mibs": moved / t / (1 << 20),
            "copy_mibs": 2 * in_b / tc / (1 << 20)}  # fmt: skip


def show(label: str, m: dict) -> None:
    print(f"{label:26s} {m['tool_mibs']:6.0f} MiB/s vs copy {m['copy_mibs']:6.0f} MiB/s  ratio {m['ratio']:.2f}"
          f"  (median of {len(m['runs'])}: tool {m['s']:.1f} s, copy {m['copy_s']:.1f} s)"
          f"  peak RssAnon {m['peak'] / (1 << 20):.0f} MiB")  # fmt: skip


def bench_size(root: Path, layers: int, repeats: int, resume_check: bool) -> dict:
    root.mkdir()
    cfg = bench_config(layers)
    fp8, bf16, mc = root / "fp8", root / "bf16", root / "mc"
    t0 = time.perf_counter()
    synthetic.write_checkpoint(fp8, cfg, fp8=True, shard_bytes=256 << 20, fast=True)
    gen = time.perf_counter() - t0
    fp8_b = dir_bytes(fp8)
    print(f"\n== {layers} layers: FP8 checkpoint {gib(fp8_b)} in {len(list(fp8.glob('*.safetensors')))} shards "
          f"(made in {gen:.0f} s)")  # fmt: skip
    r: dict = {"layers": layers, "fp8_bytes": fp8_b}
    scratch = root / "copy"
    r["fp8_to_bf16"] = measure(fp8, ["fp8-to-bf16", str(fp8)], bf16, dir_bytes, repeats, scratch)
    show("fp8-to-bf16", r["fp8_to_bf16"])
    r["hf_to_mcore"] = measure(bf16, ["hf-to-mcore", str(bf16)], mc, dir_bytes, repeats, scratch)
    show("hf-to-mcore (from BF16)", r["hf_to_mcore"])
    mc8 = root / "mc_from_fp8"
    r["fp8_to_mcore"] = measure(fp8, ["hf-to-mcore", str(fp8)], mc8, dir_bytes, 1, scratch)
    r["fp8_to_mcore"]["identical"] = same_tree_except(mc, mc8, {"hf-to-mcore.state.json"})
    show("hf-to-mcore (from FP8)", r["fp8_to_mcore"])
    print(f"  checkpoint from FP8 byte-identical to the one from BF16: {r['fp8_to_mcore']['identical']}")
    shutil.rmtree(mc8)
    out = root / "export"
    r["mcore_to_hf"] = measure(
        mc, ["mcore-to-hf", str(mc), "--config", str(bf16)], out, dir_bytes, 1, scratch
    )
    show("mcore-to-hf", r["mcore_to_hf"])
    shutil.rmtree(out)

    if resume_check:
        r["resume"] = {}
        for name, args, ref, marker in (
            ("fp8-to-bf16", ["fp8-to-bf16", str(fp8)], bf16, "*.safetensors"),
            ("hf-to-mcore", ["hf-to-mcore", str(bf16)], mc, "*.distcp"),
        ):
            dst = root / f"killed_{name}"
            total = len(list(ref.glob(marker)))
            _, _, rc = run_tool(
                [*args, str(dst)], kill_when=lambda d=dst, h=total // 2, m=marker: len(list(d.glob(m))) >= h
            )
            done_at_kill = len(list(dst.glob(marker)))
            run_tool([*args, str(dst)])
            same = same_tree(ref, dst)
            r["resume"][name] = {
                "killed": rc == -signal.SIGKILL,
                "files_at_kill": done_at_kill,
                "identical": same,
            }
            print(f"SIGKILL {name}: killed={rc == -signal.SIGKILL} with {done_at_kill}/{total} files done; "
                  f"restarted output byte-identical to an uninterrupted run: {same}")  # fmt: skip
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
    ap.add_argument("--repeats", type=int, default=3, help="alternating copy/tool runs at the large size")
    ap.add_argument("--tmp", default=None, help="parent of the temporary directory (needs ~20 GB free)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="weights-bench-", dir=a.tmp))
    try:
        small = bench_size(tmp / "small", a.layers_small, repeats=1, resume_check=False)
        large = bench_size(tmp / "large", a.layers_large, repeats=a.repeats, resume_check=True)
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
