"""`make prepare RECIPE=...`: from downloaded Hugging Face files and a raw dataset to a training-ready state.

The steps come from the recipe's `launch.paths` (only those whose inputs the recipe names):

    bf16         paths.hf_fp8 (FP8 release) -> paths.hf_model     tools.weights fp8-to-bf16 (also copies the
                                                                   tokenizer and side files, fixes config.json)
    fix-config   paths.hf_model/config.json                       tools.weights fix-config (DeepSeek-V3: no
                                                                   quantization_config, no MTP layers)
    mcore        paths.hf_model -> paths.mcore                    tools.weights hf-to-mcore (torch_dist), when
                                                                   the actor loads a dist checkpoint
    data         paths.raw_data -> paths.data                     tools.data convert (train/test parquet)
    benchmarks   benchmarks/ -> paths.benchmarks                  tools.data benchmarks (AIME 2024/2025,
                                                                   MATH-500 parquet for validation)

Each step is skipped when its output is complete, resumed when an earlier run was interrupted (the
weight tools keep a state file and redo only unfinished shards; the data tool publishes atomically), and
run otherwise. A summary says what was done. Nothing a user made is deleted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tools.data.benchmarks import BENCHMARKS, write_benchmarks
from tools.errors import UserError
from tools.recipes.recipe import compose
from tools.weights.hf_config import fix_config_file

DONE, SKIPPED, RESUMED, NOT_NEEDED = "done", "skipped (complete)", "resumed and done", "not needed"


class PrepareError(UserError):
    pass


@dataclass
class Step:
    name: str
    what: str
    output: Path | None
    complete: Callable[[], bool]
    started: Callable[[], bool]
    run: Callable[[], str]
    needed: bool = True
    why_not: str = ""


@dataclass
class Outcome:
    name: str
    status: str
    seconds: float
    detail: str = ""
    output: str = ""


@dataclass
class Summary:
    recipe: str
    outcomes: list[Outcome] = field(default_factory=list)

    def render(self) -> str:
        w = max(len(o.name) for o in self.outcomes) if self.outcomes else 4
        lines = [f"prepare {self.recipe}: summary"]
        for o in self.outcomes:
            lines.append(f"  {o.name:<{w}}  {o.status:<19} {o.seconds:7.2f} s  {o.output}")
            if o.detail:
                lines.append(f"  {'':<{w}}  {o.detail}")
        return "\n".join(lines)


def _p(value) -> Path | None:
    return Path(str(value)) if value not in (None, "", "null") else None


def _hf_complete(d: Path) -> bool:
    index = d / "model.safetensors.index.json"
    if not (index.is_file() and (d / "config.json").is_file()):
        return False
    files = set(json.loads(index.read_text())["weight_map"].values())
    return all((d / f).is_file() for f in files)


def _config_fixed(d: Path) -> bool:
    f = d / "config.json"
    if not f.is_file():
        return False
    conf = json.loads(f.read_text())
    return not conf.get("quantization_config") and not conf.get("num_nextn_predict_layers", 0)


def steps_for(cfg: DictConfig, threads: int = 2) -> list[Step]:
    L, v = cfg.launch, cfg.verl
    paths = L.paths
    fp8, hf, mcore = _p(paths.get("hf_fp8")), _p(paths.get("hf_model")), _p(paths.get("mcore"))
    raw, data = _p(paths.get("raw_data")), _p(paths.get("data"))
    deepseek = L.model_config.get("model_type") == "deepseek_v3"
    uses_dist = bool(
        OmegaConf.select(v, "actor_rollout_ref.actor.megatron.use_dist_checkpointing", default=False)
    )
    out: list[Step] = []

    def run_bf16() -> str:
        from tools.weights.fp8_to_bf16 import convert_fp8_to_bf16  # torch: only when this step runs

        r = convert_fp8_to_bf16(fp8, hf, threads=threads)
        return (
            f"{len(r.files_written)} shards written, {len(r.files_skipped)} kept from an earlier run; "
            f"{r.dequantised} tensors dequantised"
        )

    fp8_is_fp8 = (
        fp8 is not None
        and (fp8 / "config.json").is_file()
        and bool(json.loads((fp8 / "config.json").read_text()).get("quantization_config"))
    )
    out.append(
        Step(
            "bf16",
            "FP8 -> BF16 safetensors",
            hf,
            complete=lambda: hf is not None and _hf_complete(hf),
            started=lambda: hf is not None and (hf / "fp8-to-bf16.state.json").is_file(),
            run=run_bf16,
            needed=fp8_is_fp8,
            why_not="no FP8 download named (launch.paths.hf_fp8)"
            if fp8 is None
            else f"{fp8} is not an FP8 checkpoint"
            if (fp8 / "config.json").is_file()
            else f"{fp8}/config.json missing",
        )
    )

    def run_fix() -> str:
        changes = fix_config_file(hf, hf)
        return "; ".join(changes) or "nothing to change"

    out.append(
        Step(
            "fix-config",
            "config.json for verl (no quantization_config, no MTP)",
            hf and hf / "config.json",
            complete=lambda: hf is not None and _config_fixed(hf),
            started=lambda: False,
            run=run_fix,
            needed=deepseek and hf is not None,
            why_not="not a DeepSeek-V3 model",
        )
    )

    def run_mcore() -> str:
        from tools.weights.mcore_save import convert_hf_to_mcore  # torch: only when this step runs

        r = convert_hf_to_mcore(hf, mcore, threads=threads)
        return f"{r.tensors} tensors in {r.files} files ({r.files_skipped} kept from an earlier run)"

    out.append(
        Step(
            "mcore",
            "HF -> Megatron torch_dist checkpoint",
            mcore,
            complete=lambda: mcore is not None and (mcore / ".metadata").is_file(),
            started=lambda: mcore is not None and (mcore / "hf-to-mcore.state.json").is_file(),
            run=run_mcore,
            needed=mcore is not None and uses_dist,
            why_not="the actor loads HF weights (use_dist_checkpointing off)",
        )
    )

    def run_data() -> str:
        from tools.data.convert import Options, convert  # pyarrow: only when this step runs

        test_size = float(OmegaConf.select(L, "data_test_size", default=0.01) or 0.01)
        res = convert(
            Options(
                src=raw,
                dst=data,
                fmt=str(paths.get("data_format") or "deepscaler"),
                test_size=test_size,
                progress=True,
            )
        )
        return ", ".join(f"{k} {n}" for k, n in res.counts.items())

    out.append(
        Step(
            "data",
            "raw dataset -> train/test parquet in verl's schema",
            data,
            complete=lambda: data is not None
            and (data / "train.parquet").is_file()
            and (data / "test.parquet").is_file(),
            started=lambda: False,
            run=run_data,
            needed=raw is not None and data is not None,
            why_not="no raw dataset named (launch.paths.raw_data)",
        )
    )
    bench = _p(paths.get("benchmarks"))

    def run_benchmarks() -> str:
        return ", ".join(p.name for p in write_benchmarks(bench))

    def benchmarks_complete() -> bool:
        return bench is not None and all((bench / f"{n}.parquet").is_file() for n in BENCHMARKS)

    out.append(
        Step(
            "benchmarks",
            "shipped benchmarks (benchmarks/) -> validation parquet in verl's schema",
            bench,
            complete=benchmarks_complete,
            started=lambda: False,
            run=run_benchmarks,
            needed=bench is not None,
            why_not="the recipe validates on no shipped benchmark (launch.paths.benchmarks)",
        )
    )
    return out


def _inputs_missing(cfg: DictConfig, steps: list[Step]) -> list[str]:
    paths = cfg.launch.paths
    problems = []
    by = {s.name: s for s in steps}
    hf = _p(paths.get("hf_model"))
    if not by["bf16"].needed and hf is not None and not (hf / "config.json").is_file():
        fp8 = _p(paths.get("hf_fp8"))
        where = f" or the FP8 release to {fp8}" if fp8 else ""
        problems.append(f"the model: download the Hugging Face files to {hf}{where}")
    raw = _p(paths.get("raw_data"))
    if by["data"].needed and not raw.is_file() and not by["data"].complete():
        problems.append(
            f"the dataset: put the raw file at {raw} (launch.paths.raw_data), format "
            f"{paths.get('data_format', 'deepscaler')}"
        )
    return problems


def prepare(recipe: str, overrides: list[str] = (), *, threads: int = 2, log=print) -> Summary:
    cfg = compose(recipe, overrides)
    steps = steps_for(cfg, threads)
    missing = _inputs_missing(cfg, steps)
    if missing:
        raise PrepareError(
            f"prepare {recipe}: inputs missing:\n  - " + "\n  - ".join(missing),
            fix="download them (never done by this tool), or point launch.paths.* at them, e.g. "
            f"ASCEND_R1_DATA=<folder> make prepare RECIPE={recipe}",
        )
    summary = Summary(recipe)
    n = len(steps)
    for i, step in enumerate(steps, 1):
        t0 = time.perf_counter()
        head = f"[{i}/{n}] {step.name}: {step.what}"
        if not step.needed:
            log(f"{head}: {NOT_NEEDED} ({step.why_not})")
            summary.outcomes.append(Outcome(step.name, NOT_NEEDED, 0.0, step.why_not))
            continue
        if step.complete():
            log(f"{head}: {SKIPPED} -> {step.output}")
            summary.outcomes.append(
                Outcome(step.name, SKIPPED, time.perf_counter() - t0, "", str(step.output))
            )
            continue
        resuming = step.started()
        log(f"{head}: {'resuming an interrupted run' if resuming else 'running'} -> {step.output}")
        detail = step.run()
        if not step.complete():
            raise PrepareError(
                f"prepare {recipe}: step {step.name} ran but its output {step.output} is not complete",
                fix="run make prepare again; if it repeats, report it with the output above",
            )
        status = RESUMED if resuming else DONE
        log(f"{head}: {status} ({detail})")
        summary.outcomes.append(
            Outcome(step.name, status, time.perf_counter() - t0, detail, str(step.output))
        )
    return summary


def main(args) -> int:
    summary = prepare(args.recipe, args.overrides, threads=args.threads)
    print(summary.render())
    return 0
