"""verl's RL parquet schema (verl 0.6.0 `RLHFDataset` + reward managers) and a validator for it.

Columns read by verl: `prompt` (chat message list, rendered with the tokenizer's chat template),
`data_source` (passed to the reward function), `reward_model.ground_truth`, `extra_info` (passed to
the reward function; `extra_info.index` becomes the sample index). `ability` is carried along.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from tools.data.parquet import iter_batches, open_parquet

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(MESSAGE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct([("split", pa.string()), ("index", pa.int64()), ("source_row", pa.int64())]),
        ),
    ]
)
ROLES = {"system", "user", "assistant"}


def validate_parquet(path: str | Path, max_errors: int = 10) -> list[str]:
    """Problems found in a parquet meant for verl (empty list: fine). Reads in batches."""
    path = Path(path)
    errors: list[str] = []
    fix = "convert the dataset again: make data SRC=<dataset> DST=<folder>"
    schema = open_parquet(path, fix).schema_arrow
    for field in SCHEMA:
        if field.name not in schema.names:
            errors.append(f"{path}: column {field.name!r} is missing (verl needs it)")
        elif not schema.field(field.name).type.equals(field.type):
            errors.append(
                f"{path}: column {field.name!r} is {schema.field(field.name).type}, expected {field.type}"
            )
    if errors:
        return errors
    row = 0
    for batch in iter_batches(path, fix, batch_size=4096, columns=[f.name for f in SCHEMA]):
        for rec in batch.to_pylist():
            row += 1
            where = f"{path}: row {row}"
            prompt = rec["prompt"] or []
            if not prompt:
                errors.append(f"{where}: field 'prompt' is empty")
            elif any(m["role"] not in ROLES or not m["content"] for m in prompt):
                errors.append(f"{where}: field 'prompt' has a message without a known role or content")
            elif prompt[-1]["role"] != "user":
                errors.append(f"{where}: field 'prompt' must end with a user message")
            rm = rec["reward_model"] or {}
            if rm.get("style") != "rule" or not rm.get("ground_truth"):
                errors.append(
                    f"{where}: field 'reward_model' needs style 'rule' and a non-empty ground_truth"
                )
            if not rec["data_source"]:
                errors.append(f"{where}: field 'data_source' is empty")
            ei = rec["extra_info"] or {}
            if ei.get("split") is None or ei.get("index") is None:
                errors.append(f"{where}: field 'extra_info' needs split and index")
            if len(errors) >= max_errors:
                return errors
    return errors
