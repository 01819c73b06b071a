"""python -m tools.data convert|check|show-prompt|benchmarks  (see docs/data-and-rewards.md, docs/evaluation.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.data.benchmarks import BENCHMARKS, benchmark_spec, write_benchmarks
from tools.data.convert import ConvertError, Options, convert, print_summary
from tools.data.formats import FORMATS
from tools.data.parquet import open_parquet
from tools.data.schema import validate_parquet
from tools.data.template import STYLES, TEMPLATES, build_prompt, instruction
from tools.data.tokenizer import load_tokenizer


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tools.data", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser(
        "convert", help="a dataset file -> DST/{train,test}.parquet + data_card.md + lengths.png"
    )
    c.add_argument("src", type=Path, help=".json (array or lines), .jsonl or .parquet")
    c.add_argument("dst", type=Path, help="output folder (created; must be new or a previous conversion)")
    c.add_argument("--format", dest="fmt", default="deepscaler", choices=[*FORMATS, "generic"])
    c.add_argument("--problem-field", help="generic: dotted path of the problem text")
    c.add_argument("--answer-field", help="generic: dotted path of the answer")
    c.add_argument(
        "--answer-from-boxed",
        action="store_true",
        help="generic: take the last \\boxed{} of the answer field",
    )
    c.add_argument("--data-source", help="value of the data_source column (default: the dataset's hub name)")
    c.add_argument(
        "--style",
        default="system",
        choices=STYLES,
        help="R1-Zero instruction as system message or user prefix",
    )
    c.add_argument(
        "--template",
        default="r1-zero",
        choices=list(TEMPLATES),
        help="the instruction: r1-zero (the paper's preamble) or short (one sentence, same format)",
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument(
        "--test-size", type=float, default=0.0, help="fraction (<1) or number of rows (>=1) for test.parquet"
    )
    c.add_argument("--no-dedupe", dest="dedupe", action="store_false", help="keep repeated problems")
    c.add_argument(
        "--skip-bad", action="store_true", help="skip malformed rows and count them, instead of stopping"
    )
    c.add_argument("--tokenizer", help="model folder: count prompt tokens with its chat template")
    c.add_argument(
        "--max-prompt-length", type=int, help="drop prompts longer than this many tokens (needs --tokenizer)"
    )
    c.add_argument("--overwrite", action="store_true", help="replace a previous conversion in DST")
    c.add_argument("--quiet", action="store_true", help="no progress bar")

    b = sub.add_parser(
        "benchmarks",
        help="the shipped benchmarks (benchmarks/) -> DST/<name>.parquet with the prompt template",
    )
    b.add_argument("dst", type=Path, help="output folder, e.g. data/benchmarks")
    b.add_argument("--names", help="comma-separated (default: all): " + ", ".join(BENCHMARKS))
    b.add_argument("--style", default="system", choices=STYLES)
    b.add_argument("--template", default="r1-zero", choices=list(TEMPLATES))

    k = sub.add_parser("check", help="validate parquet files against verl's RL schema")
    k.add_argument("files", type=Path, nargs="+")

    s = sub.add_parser("show-prompt", help="render one prompt through the model's chat template")
    s.add_argument("--tokenizer", required=True, help="model or tokenizer folder")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--parquet", type=Path, help="a converted parquet: show its row --row")
    g.add_argument("--problem", help="a problem text, with the R1-Zero template of --style")
    s.add_argument("--row", type=int, default=0)
    s.add_argument("--style", default="system", choices=STYLES)
    s.add_argument("--template", default="r1-zero", choices=list(TEMPLATES))
    return ap


def _show_prompt(args: argparse.Namespace) -> int:
    if args.parquet:
        table = open_parquet(args.parquet).read(columns=["prompt", "reward_model"])
        if not 0 <= args.row < table.num_rows:
            raise ConvertError(f"{args.parquet}: --row {args.row} is out of range (0..{table.num_rows - 1})")
        messages = table.column("prompt")[args.row].as_py()
        truth = table.column("reward_model")[args.row].as_py()["ground_truth"]
    else:
        messages, truth = build_prompt(args.problem, args.style, instruction(args.template)), None
    tok = load_tokenizer(args.tokenizer)
    if not tok.chat_template:
        raise ConvertError(f"--tokenizer {args.tokenizer}: has no chat template")
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    print(text)
    print(f"--- {n} tokens" + (f"; ground truth: {truth}" if truth is not None else ""), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "convert":
        opts = Options(
            src=args.src,
            dst=args.dst,
            fmt=args.fmt,
            data_source=args.data_source,
            problem_field=args.problem_field,
            answer_field=args.answer_field,
            answer_from_boxed=args.answer_from_boxed,
            style=args.style,
            template=args.template,
            seed=args.seed,
            test_size=args.test_size,
            dedupe=args.dedupe,
            skip_bad=args.skip_bad,
            tokenizer=args.tokenizer,
            max_prompt_length=args.max_prompt_length,
            overwrite=args.overwrite,
            progress=not args.quiet,
        )
        print_summary(convert(opts))
        return 0
    if args.cmd == "benchmarks":
        names = [n.strip() for n in args.names.split(",") if n.strip()] if args.names else list(BENCHMARKS)
        for n in names:
            benchmark_spec(n)  # an unknown name stops before anything is written
        for path in write_benchmarks(args.dst, names, args.style, args.template):
            print(f"  wrote {path}")
        return 0
    if args.cmd == "check":
        bad = 0
        for f in args.files:
            errors = validate_parquet(f)
            bad += bool(errors)
            print("\n".join(errors) if errors else f"{f}: ok")
        return 1 if bad else 0
    return _show_prompt(args)
