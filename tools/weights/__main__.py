"""`python -m tools.weights <command>`: the weight tools' command line."""

from __future__ import annotations

import argparse
from pathlib import Path

from tools.errors import run_cli
from tools.weights import hf_config


def _fix_config(a: argparse.Namespace) -> int:
    changes = hf_config.fix_config_file(Path(a.src), Path(a.dst or a.src))
    print("config.json: " + ("; ".join(changes) if changes else "nothing to change"))
    return 0


def _fp8_to_bf16(a: argparse.Namespace) -> int:
    from tools.weights.fp8_to_bf16 import convert_fp8_to_bf16  # torch: not for fix-config or --help

    r = convert_fp8_to_bf16(Path(a.src), Path(a.dst), threads=a.threads, band_bytes=a.band_mb << 20)
    print(
        f"wrote {len(r.files_written)} shards ({len(r.files_skipped)} already done by an earlier run), "
        f"{r.dequantised} tensors dequantised, {r.copied} copied, total_size {r.total_size} bytes"
    )
    print("config.json: " + ("; ".join(r.config_changes) if r.config_changes else "nothing to change"))
    print("copied: " + ", ".join(r.copied_files))
    return 0


def _hf_to_mcore(a: argparse.Namespace) -> int:
    from tools.weights.mcore_save import convert_hf_to_mcore  # torch: not for fix-config or --help

    r = convert_hf_to_mcore(
        Path(a.src),
        Path(a.dst),
        threads=a.threads,
        file_bytes=a.file_mb << 20,
        chunk_bytes=a.chunk_mb << 20,
        layer_spec=a.layer_spec,
    )
    print(
        f"wrote {r.tensors} tensors ({r.params:,} parameters, {r.bytes:,} bytes) and {r.objects} "
        f"_extra_state objects in {r.files} files ({r.files_skipped} already done by an earlier run)"
    )
    print(f"skipped {len(r.skipped)} tensors (MTP, not part of the Megatron model):")
    for name in r.skipped:
        print(f"  {name}")
    return 0


def _mcore_to_hf(a: argparse.Namespace) -> int:
    from tools.weights.mcore_to_hf import export_mcore_to_hf  # torch: not for fix-config or --help

    r = export_mcore_to_hf(
        Path(a.src),
        Path(a.config),
        Path(a.dst),
        shard_bytes=a.shard_mb << 20,
        threads=a.threads,
        layer_spec=a.layer_spec,
    )
    print(f"wrote {r.tensors} tensors in {r.files} shards, total_size {r.total_size} bytes")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.weights", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("fix-config", help="remove quantization_config, set num_nextn_predict_layers=0")
    s.add_argument("src", help="config.json or a model directory")
    s.add_argument("dst", nargs="?", help="where to write (default: in place)")
    s.set_defaults(fn=_fix_config)

    s = sub.add_parser("fp8-to-bf16", help="DeepSeek-V3 FP8 checkpoint -> BF16 (CPU, streamed, resumable)")
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--band-mb", type=int, default=32, help="rows per band so that one band is at most this")
    s.set_defaults(fn=_fp8_to_bf16)

    s = sub.add_parser(
        "hf-to-mcore", help="HF (BF16 or FP8) -> Megatron torch_dist checkpoint, no model built"
    )
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--file-mb", type=int, default=1024, help="cap on the bytes per .distcp file")
    s.add_argument("--chunk-mb", type=int, default=64, help="largest chunk read from the source at once")
    s.add_argument(
        "--layer-spec",
        choices=["te", "local"],
        default="te",
        help="key names of megatron-core's Transformer-Engine spec (te, default) or local spec (local: "
        "without TE, e.g. the CPU run)",
    )
    s.set_defaults(fn=_hf_to_mcore)

    s = sub.add_parser("mcore-to-hf", help="Megatron torch_dist checkpoint -> HF safetensors shards + index")
    s.add_argument("src", help="the torch_dist checkpoint directory (with .metadata)")
    s.add_argument("dst")
    s.add_argument(
        "--config", required=True, help="HF model directory with config.json (tokenizer copied too)"
    )
    s.add_argument("--shard-mb", type=int, default=4096)
    s.add_argument(
        "--layer-spec",
        choices=["te", "local"],
        default=None,
        help="key names in the checkpoint: Transformer-Engine spec (te) or local spec (local: CPU runs); "
        "read from the checkpoint's keys when left out",
    )
    s.add_argument("--threads", type=int, default=2)
    s.set_defaults(fn=_mcore_to_hf)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    run_cli(main)
