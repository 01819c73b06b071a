"""The embedded default run's inputs, made locally, deterministically and cached (nothing downloaded).

Where they go and the model's shape come from the recipe (`launch.paths`, `launch.model_config` of
recipes/model/tiny-deepseek-v3.yaml):

    paths.hf_model   a tiny DeepSeek-V3-architecture HF model (MLA + MoE, random init, seeded) with a
                     byte-level BPE tokenizer trained offline and a chat template
    paths.raw_data   DeepScaleR-format problems with known answers (JSON)
    paths.data       train.parquet / test.parquet made from it by the project's data tool
    paths.mcore      the model as a Megatron torch_dist checkpoint, made by the project's hf-to-mcore

Each part is built in a temporary folder beside its destination and renamed into place when complete,
with a stamp of what it was made from, so a change of the recipe's model or of ASSETS_VERSION rebuilds
it and nothing else. `python -m tools.launch.assets [RECIPE]` makes them by hand.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools import atomic
from tools.errors import UserError

ASSETS_VERSION = 1
SEED = 1234
N_PROBLEMS = 64
N_TEST = 8
STAMP = ".assets-stamp.json"
Log = Callable[[str], None]


def model_config(vocab_size: int, **overrides: Any) -> dict[str, Any]:
    """transformers' DeepseekV3 config scaled down: MLA with q/kv LoRA, one dense layer then MoE layers
    with a shared expert, grouped sigmoid routing with a bias, YaRN rope; no MTP, no FP8.
    `overrides` (the recipe's launch.model_config) replace the defaults below."""
    from tools.weights.synthetic import tiny_config

    cfg = tiny_config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        max_position_embeddings=1024,
        rope_scaling={
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 256,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        num_nextn_predict_layers=0,
        torch_dtype="float32",
    )
    cfg.pop("quantization_config", None)
    cfg.update({k: v for k, v in overrides.items() if k != "vocab_size"})
    cfg["vocab_size"] = vocab_size
    return cfg


@dataclass(frozen=True)
class Assets:
    hf_model: Path
    raw_data: Path
    data: Path
    mcore: Path
    model_overrides: Mapping[str, Any]

    @classmethod
    def from_launch(cls, launch: Any) -> Assets:
        """From a composed recipe's `launch` section (tools.launch.recipe.compose(...).launch)."""
        from omegaconf import OmegaConf

        p = launch.paths
        overrides = OmegaConf.to_container(launch.get("model_config") or {}, resolve=True)
        overrides.pop("model_type", None)
        return cls(Path(p.hf_model), Path(p.raw_data), Path(p.data), Path(p.mcore), overrides)

    @property
    def train_parquet(self) -> Path:
        return self.data / "train.parquet"

    @property
    def test_parquet(self) -> Path:
        return self.data / "test.parquet"


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _fresh(folder: Path, digest: str) -> bool:
    stamp = folder / STAMP
    try:
        return json.loads(stamp.read_text())["digest"] == digest
    except (OSError, ValueError, KeyError):
        return False


def _publish(tmp: Path, folder: Path, digest: str) -> None:
    atomic.write_json(tmp / STAMP, {"digest": digest, "version": ASSETS_VERSION})
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _tmp_for(folder: Path) -> Path:
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def make_model(a: Assets, log: Log = print) -> bool:
    """Tokenizer + random-init DeepseekV3ForCausalLM (seeded). Returns True when (re)built."""
    import torch
    from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

    from tools.data.synthetic import tiny_tokenizer

    vocab = int(a.model_overrides.get("vocab_size", 512))
    want = {"v": ASSETS_VERSION, "seed": SEED, "vocab": vocab, "overrides": dict(a.model_overrides)}
    if _fresh(a.hf_model, _digest(want)):
        return False
    log(f"making the tiny DeepSeek-V3 model and its tokenizer in {a.hf_model} (random init, seed {SEED})")
    tmp = _tmp_for(a.hf_model)
    # the tokenizer is trained offline on a fixed corpus: deterministic; it never exceeds `vocab`
    tiny_tokenizer(tmp, vocab_size=vocab)
    tok = AutoTokenizer.from_pretrained(tmp)
    cfg = model_config(**{**a.model_overrides, "vocab_size": vocab})
    cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(SEED)
    hf_cfg = DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    # the recipe's torch_dtype (float32 unless it says otherwise; vLLM's CPU MLA runs bf16)
    model = DeepseekV3ForCausalLM(hf_cfg).to(getattr(torch, str(cfg.get("torch_dtype") or "float32")))
    model.save_pretrained(tmp, safe_serialization=True)
    # config.json exactly as planned (DeepSeek-V3's own keys): verl and hf-to-mcore read it
    atomic.write_json(tmp / "config.json", {**cfg, "architectures": ["DeepseekV3ForCausalLM"]})
    _publish(tmp, a.hf_model, _digest(want))
    return True


def make_data(a: Assets, log: Log = print) -> bool:
    """DeepScaleR-format JSON of problems with known answers -> the project's data tool -> parquet."""
    from tools.data.synthetic import deepscaler_rows, write_json

    digest = _digest({"v": ASSETS_VERSION, "n": N_PROBLEMS, "test": N_TEST, "seed": SEED})
    if _fresh(a.data, digest) and a.raw_data.exists():
        return False
    log(f"making {N_PROBLEMS} DeepScaleR-format problems ({a.raw_data}) and converting them ({a.data})")
    a.raw_data.parent.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(a.raw_data) as tmp_json:
        write_json(deepscaler_rows(N_PROBLEMS, seed=SEED), tmp_json)
    tmp = a.data.with_name(a.data.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "tools.data", "convert", str(a.raw_data), str(tmp),
        "--format", "deepscaler", "--test-size", str(N_TEST), "--seed", str(SEED),
        "--data-source", "tiny-deepscaler", "--quiet",
    ]  # fmt: skip
    _run(cmd, "python -m tools.data convert")
    _publish(tmp, a.data, digest)
    return True


def layer_spec() -> str:
    """The megatron-core layer spec the run's model uses: Transformer Engine's when TE is installed,
    the local one otherwise (as verl's model initializer decides)."""
    import importlib.util

    return "te" if importlib.util.find_spec("transformer_engine") else "local"


def make_mcore(a: Assets, log: Log = print) -> bool:
    """The HF model as a Megatron torch_dist checkpoint, by the project's own hf-to-mcore, with the key
    names of the layer spec the run builds."""
    spec = layer_spec()
    model_digest = json.loads((a.hf_model / STAMP).read_text())["digest"]
    digest = _digest({"v": ASSETS_VERSION, "model": model_digest, "spec": spec})
    if _fresh(a.mcore, digest):
        return False
    log(f"converting the model to a Megatron checkpoint in {a.mcore} (hf-to-mcore, {spec} layer spec)")
    tmp = a.mcore.with_name(a.mcore.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "tools.weights", "hf-to-mcore", str(a.hf_model), str(tmp), "--threads", "1",
           "--layer-spec", spec]  # fmt: skip
    _run(cmd, "python -m tools.weights hf-to-mcore")
    _publish(tmp, a.mcore, digest)
    return True


def _run(cmd: list[str], what: str) -> None:
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(
            f"{what} failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}",
            fix="run the command above by hand to see the whole output",
        )


def ensure(a: Assets, *, mcore: bool = False, log: Log = print) -> Assets:
    """Make whatever is missing or stale; cheap when everything is cached."""
    make_model(a, log)
    make_data(a, log)
    if mcore:
        make_mcore(a, log)
    return a


def main(argv: list[str] | None = None) -> int:
    import argparse

    from tools.launch.recipe import compose

    ap = argparse.ArgumentParser(prog="python -m tools.launch.assets", description=__doc__)
    ap.add_argument("recipe", nargs="?", default="tiny-cpu")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the recipe")
    a = ap.parse_args(argv)
    cfg = compose(a.recipe, a.overrides)
    ensure(Assets.from_launch(cfg.launch), mcore=cfg.launch.backend == "megatron")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
