"""Data and weight rules: the training/validation parquet files exist with verl's schema (and feed the
steps asked); the HF weights exist in the format verl takes; the Megatron checkpoint exists when the recipe
loads one."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from tools.launch.plan import batch
from tools.launch.plan.context import Context

G = "machine"


def prepare_fix(ctx: Context) -> str:
    made_by = ctx.launch.paths.get("made_by")
    return f"run {made_by}" if made_by else f"run `make prepare RECIPE={ctx.launch.recipe}`"


def data_rules(ctx: Context) -> None:
    # pyarrow: only when the data is checked (make plan NO_ENV=1 reads none)
    from tools.data.parquet import ParquetError, data_fix, open_parquet
    from tools.data.schema import SCHEMA

    keyed = [  # (the recipe's key, a file it names)
        (f"verl.data.{k}", str(f))
        for k in ("train_files", "val_files")
        for x in [ctx.get(f"data.{k}")]
        for f in (x if isinstance(x, list) else [x])
        if f
    ]
    files = [f for _, f in keyed]
    paths = ctx.launch.get("paths") or {}

    def fix(key: str, f: str) -> str:  # the recipe's own tooling where it makes the file, else make data
        if paths.get("benchmarks") and Path(f).parent == Path(str(paths.get("benchmarks"))):
            return f"{prepare_fix(ctx)}, or make benchmarks DST={Path(f).parent} (the shipped benchmarks)"
        return data_fix(f, key, paths.get("data"), prepare_fix(ctx), paths.get("raw_data"))

    missing = [(k, f) for k, f in keyed if not Path(f).is_file()]
    if missing:
        ctx.add(G, "data present", False, ", ".join(f for _, f in missing), fix(*missing[0]))
        return
    problems, rows, bad = [], 0, None
    for k, f in keyed:
        try:
            pf = open_parquet(f)  # an empty, truncated or garbage file: named, with what is wrong
        except ParquetError as e:
            problems.append(str(e))
            bad = bad or (k, f)
            continue
        schema = pf.schema_arrow
        for field in SCHEMA:
            if field.name not in schema.names:
                problems.append(f"{f}: no column {field.name!r}")
                bad = bad or (k, f)
        rows += pf.metadata.num_rows
    ctx.add(
        G,
        "data present, verl's schema",
        not problems,
        f"{len(files)} files, {rows} rows",
        "; ".join(problems[:3]) + (f"; {fix(*bad)}" if bad else ""),
    )
    train_files = ctx.get("data.train_files")
    if not problems and train_files:
        batch.steps_rule(ctx, train_files)


def weight_rules(ctx: Context) -> None:
    paths = ctx.launch.paths
    hf = Path(str(ctx.get("actor_rollout_ref.model.path")))
    fix = prepare_fix(ctx)
    cfg_file = hf / "config.json"
    if not cfg_file.is_file():
        ctx.add(G, "weights present", False, f"{cfg_file} missing", fix)
        return
    try:
        conf = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        ctx.add(G, "HF weights, format", False, f"{cfg_file}: not JSON ({e})", fix)
        return
    issues = []
    if conf.get("quantization_config"):
        issues.append("config.json declares quantization_config (verl refuses): make fix-config")
    if conf.get("num_nextn_predict_layers", 0):
        issues.append(
            f"num_nextn_predict_layers={conf['num_nextn_predict_layers']} (verl refuses MTP): make fix-config"
        )
    for k, want in OmegaConf.to_container(ctx.launch.model_config).items():
        if k in conf and conf[k] != want:
            issues.append(f"config.json {k}={conf[k]} but recipe launch.model_config.{k}={want}")
    shards = list(hf.glob("*.safetensors"))
    if not shards:
        issues.append(f"no *.safetensors in {hf}")
    if not any((hf / t).is_file() for t in ("tokenizer.json", "tokenizer.model")):
        issues.append(f"no tokenizer.json in {hf}")
    ctx.add(
        G, "HF weights, format", not issues, f"{hf}: {len(shards)} shards", "; ".join(issues) + f" ({fix})"
    )
    for role in ("actor", "ref"):
        if ctx.get(f"actor_rollout_ref.{role}.megatron.use_dist_checkpointing"):
            ck = Path(str(ctx.get(f"actor_rollout_ref.{role}.megatron.dist_checkpointing_path")))
            ok = (
                (ck / ".metadata").is_file()
                or (ck / "iter_0000000" / ".metadata").is_file()
                or any(ck.glob("*/.metadata"))
            )
            ctx.add(
                G,
                f"{role} Megatron checkpoint",
                ok,
                str(ck),
                f"no torch_dist checkpoint (.metadata) there: make convert-mcore SRC={paths.get('hf_model')} "
                f"DST={ck}, or {fix}",
            )
