"""The embedded default run's inputs, made locally, deterministically and cached (nothing downloaded).

    <root>/model/     a tiny DeepSeek-V3-architecture HF model (MLA + MoE, random init, seeded) with a
                      byte-level BPE tokenizer trained offline and a chat template
    <root>/deepscaler.json   DeepScaleR-format problems with known answers
    <root>/data/      train.parquet / test.parquet made from it by the project's data tool
    <root>/mcore/     the model as a Megatron torch_dist checkpoint, made by the project's hf-to-mcore

Each part is built in a temporary folder beside its destination and renamed into place when complete,
with a stamp of the recipe of the assets (ASSETS_VERSION + the model config) so that a change of either
rebuilds it. `python -m tools.launch.assets [ROOT]` makes them by hand.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools import atomic
from tools.errors import UserError

ASSETS_VERSION = 1
DEFAULT_ROOT = Path(".cache/tiny")
SEED = 1234
N_PROBLEMS = 64
N_TEST = 8
STAMP = ".assets-stamp.json"


def model_config(vocab_size: int) -> dict[str, Any]:
    """transformers' DeepseekV3 config scaled down: MLA with q/kv LoRA, one dense layer then MoE layers
    with a shared expert, grouped sigmoid routing with a bias, YaRN rope; no MTP, no FP8."""
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
    return cfg


@dataclass(frozen=True)
class Assets:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def source_json(self) -> Path:
        return self.root / "deepscaler.json"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def train_parquet(self) -> Path:
        return self.data / "train.parquet"

    @property
    def test_parquet(self) -> Path:
        return self.data / "test.parquet"

    @property
    def mcore(self) -> Path:
        return self.root / "mcore"


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


def make_model(a: Assets, log=print) -> bool:
    """Tokenizer + random-init DeepseekV3ForCausalLM (seeded). Returns True when (re)built."""
    import torch
    from transformers import AutoTokenizer, DeepseekV3Config, DeepseekV3ForCausalLM

    from tools.data.synthetic import tiny_tokenizer

    # the tokenizer is deterministic for a fixed corpus; its size fixes the model's vocabulary
    tok_tmp = _tmp_for(a.root / "tokenizer")
    tiny_tokenizer(tok_tmp)
    tok = AutoTokenizer.from_pretrained(tok_tmp)
    cfg = model_config(len(tok))
    cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    digest = _digest({"v": ASSETS_VERSION, "seed": SEED, "config": cfg, "vocab": tok.get_vocab()})
    if _fresh(a.model, digest):
        shutil.rmtree(tok_tmp)
        return False
    log(f"making the tiny DeepSeek-V3 model in {a.model} (random init, seed {SEED})")
    tmp = _tmp_for(a.model)
    torch.manual_seed(SEED)
    hf_cfg = DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    model = DeepseekV3ForCausalLM(hf_cfg).to(torch.float32)
    model.save_pretrained(tmp, safe_serialization=True)
    # keep config.json exactly as planned (DeepSeek-V3's own keys), as verl and hf-to-mcore read it
    atomic.write_json(tmp / "config.json", {**cfg, "architectures": ["DeepseekV3ForCausalLM"]})
    tok.save_pretrained(tmp)
    shutil.rmtree(tok_tmp)
    _publish(tmp, a.model, digest)
    return True


def make_data(a: Assets, log=print) -> bool:
    """DeepScaleR-format JSON of problems with known answers -> the data tool -> parquet."""
    from tools.data.synthetic import deepscaler_rows, write_json

    digest = _digest({"v": ASSETS_VERSION, "n": N_PROBLEMS, "test": N_TEST, "seed": SEED})
    if _fresh(a.data, digest) and a.source_json.exists():
        return False
    log(f"making {N_PROBLEMS} DeepScaleR-format problems in {a.source_json} and converting them to {a.data}")
    a.root.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(a.source_json) as tmp_json:
        write_json(deepscaler_rows(N_PROBLEMS, seed=SEED), tmp_json)
    tmp = a.data.with_name(a.data.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "tools.data", "convert", str(a.source_json), str(tmp),
        "--format", "deepscaler", "--test-size", str(N_TEST), "--seed", str(SEED),
        "--data-source", "tiny-deepscaler", "--quiet",
    ]  # fmt: skip
    _run(cmd, "python -m tools.data convert")
    _publish(tmp, a.data, digest)
    return True


def make_mcore(a: Assets, log=print) -> bool:
    """The HF model as a Megatron torch_dist checkpoint, by the project's own hf-to-mcore."""
    digest = _digest({"v": ASSETS_VERSION, "model": json.loads((a.model / STAMP).read_text())["digest"]})
    if _fresh(a.mcore, digest):
        return False
    log(f"converting the model to a Megatron checkpoint in {a.mcore} (python -m tools.weights hf-to-mcore)")
    tmp = a.mcore.with_name(a.mcore.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    _run(
        [sys.executable, "-m", "tools.weights", "hf-to-mcore", str(a.model), str(tmp), "--threads", "1"],
        "python -m tools.weights hf-to-mcore",
    )
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


def ensure(root: Path = DEFAULT_ROOT, *, mcore: bool = False, log=print) -> Assets:
    a = Assets(Path(root))
    a.root.mkdir(parents=True, exist_ok=True)
    make_model(a, log)
    make_data(a, log)
    if mcore:
        make_mcore(a, log)
    return a


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tools.launch.assets", description=__doc__)
    ap.add_argument("root", nargs="?", default=str(DEFAULT_ROOT))
    ap.add_argument("--mcore", action="store_true", help="also the Megatron checkpoint")
    a = ap.parse_args(argv)
    ensure(Path(a.root), mcore=a.mcore)
    return 0


if __name__ == "__main__":
    sys.exit(main())
