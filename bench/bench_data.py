"""Converting DeepScaleR-sized data: our converter against a minimal load-everything baseline.

    python bench/bench_data.py [--rows 40000] [--tokenizer]

The source is a synthetic DeepScaleR JSON array (problem ~300 chars, solution ~1.5 KB, answer).
Baseline: json.load of the whole file, rows built in a list comprehension, one pyarrow write: no
validation, de-duplication, split, card or atomic publish. Ours: `tools.data.convert` with
de-duplication, a 1% test split and the data card; with --tokenizer also the prompt-length filter
(a tiny word-level tokenizer, so this measures our overhead rather than a real BPE).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from tools.data import synthetic as syn  # noqa: E402
from tools.data.convert import Options, convert  # noqa: E402
from tools.data.schema import SCHEMA  # noqa: E402
from tools.data.template import build_prompt  # noqa: E402


def make_source(path: Path, rows: int) -> None:
    rng = random.Random(0)
    words = "let the sum of all positive integers n such that find compute triangle area probability".split()
    data = []
    for i in range(rows):
        problem = f"Problem {i}. " + " ".join(rng.choice(words) for _ in range(rng.randint(20, 90)))
        solution = (
            " ".join(rng.choice(words) for _ in range(rng.randint(150, 350))) + f" \\boxed{{{i % 997}}}"
        )
        data.append({"problem": problem, "answer": str(i % 997), "solution": solution})
    path.write_text(json.dumps(data), encoding="utf-8")


def baseline(src: Path, dst: Path) -> int:
    data = json.loads(src.read_text(encoding="utf-8"))
    rows = [
        {
            "data_source": "deepscaler",
            "prompt": build_prompt(r["problem"]),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": r["answer"]},
            "extra_info": {"split": "train", "index": i, "source_row": i + 1},
        }
        for i, r in enumerate(data)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), dst)
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument(
        "--tokenizer", action="store_true", help="also filter by prompt length with a tiny tokenizer"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        src = tmp / "deepscaler.json"
        make_source(src, args.rows)
        print(f"source: {args.rows} rows, {src.stat().st_size / 2**20:.1f} MiB JSON array")
        import matplotlib.pyplot  # noqa: F401  (import cost outside both timings)

        t = time.perf_counter()
        n = baseline(src, tmp / "baseline.parquet")
        t_base = time.perf_counter() - t
        tok = str(syn.tiny_tokenizer(tmp / "tok")) if args.tokenizer else None
        t = time.perf_counter()
        res = convert(
            Options(
                src=src,
                dst=tmp / "out",
                test_size=0.01,
                tokenizer=tok,
                max_prompt_length=4096 if tok else None,
                progress=False,
            )
        )
        t_ours = time.perf_counter() - t
        print(f"baseline (json.load + one write)     : {t_base:6.2f} s  ({n} rows)")
        print(
            f"{'tools.data convert' + (' + length filter' if tok else ''):<37}: {t_ours:6.2f} s  (train {res.counts['train']}, test {res.counts['test']})"
        )
        print(f"ratio ours / baseline                : {t_ours / t_base:6.2f}")
        print(f"throughput                           : {args.rows / t_ours:,.0f} rows/s")


if __name__ == "__main__":
    main()
