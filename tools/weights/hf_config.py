"""Fix-up of a DeepSeek-V3 config.json for BF16 training with verl and Megatron.

- `quantization_config` is removed: the weights are BF16 after conversion, and verl's config
  converter refuses a config that declares FP8 quantisation.
- `num_nextn_predict_layers` is set to 0: the MTP layer is not converted (see mcore_plan).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tools import atomic
from tools.weights.errors import WeightsError


def fix_config(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Return the fixed config and a list of human-readable changes (empty when nothing changed)."""
    fixed = copy.deepcopy(config)
    changes: list[str] = []
    if "quantization_config" in fixed:
        qc = fixed.pop("quantization_config")
        changes.append(f"removed quantization_config ({json.dumps(qc, sort_keys=True)})")
    if fixed.get("num_nextn_predict_layers", 0) != 0:
        changes.append(f"num_nextn_predict_layers: {fixed['num_nextn_predict_layers']} -> 0")
        fixed["num_nextn_predict_layers"] = 0
    return fixed, changes


def read_config(path: Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise WeightsError(f"{path}: no config.json found; point at a Hugging Face model directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise WeightsError(f"{path}: not valid JSON ({e}); restore the file from the model's source") from e


def fix_config_file(src: Path, dst: Path) -> list[str]:
    """Read config.json from `src` (file or directory), write the fixed one to `dst` atomically."""
    fixed, changes = fix_config(read_config(src))
    dst = Path(dst)
    if dst.is_dir():
        dst = dst / "config.json"
    atomic.write_json(dst, fixed)
    return changes
