"""The trained actor, scored like the base model: after a recipe that learns (launch.final_eval), the
actor of the last checkpoint is exported to HF (the project's mcore-to-hf) and scored on the held-out
problems exactly as its base model was (tools/miniature/addition_model.py or trace_model.py `evaluate`),
into the run folder's final_eval.json, which the analyses (tools/analysis/learning.py) read.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from tools import atomic
from tools.errors import UserError
from tools.miniature import addition_model as B
from tools.miniature import trace_model as TM
from tools.miniature.assets import layer_spec, long_addition_split
from tools.records import read_json
from tools.tasks.addition import Problems

FINAL_FILE = "final_eval.json"
Log = B.Log


def actor_model_checkpoint(actor: Path) -> Path:
    """The Megatron torch_dist checkpoint of the actor's weights in a verl checkpoint's actor folder:
    `actor/dist_ckpt` (verl 0.6.0) or the model entry of `actor/ckpt_contents.json` (verl 0.9.1 keeps the
    model, optimizer and extra state apart: `actor/model/dist_ckpt`)."""
    contents = read_json(actor / "ckpt_contents.json")
    rel = ((contents or {}).get("contents") or {}).get("model", {}).get("path")
    for ckpt in [actor / rel] if rel else [actor / "dist_ckpt", actor / "model" / "dist_ckpt"]:
        if (ckpt / "metadata.json").is_file():
            return ckpt
    raise UserError(
        f"{actor}: no actor model checkpoint to evaluate (dist_ckpt/ or model/dist_ckpt/ with metadata.json)",
        fix="the recipe must save at its last step (verl.trainer.save_freq)",
    )


def final_eval(run: Path, cfg: Any, step: int, log: Log = print) -> dict[str, Any]:
    """Export the actor of checkpoint `step` to HF (the project's mcore-to-hf) and score it on the held-out
    problems exactly as the base model was scored (greedy and sampled); writes run/final_eval.json."""
    from omegaconf import OmegaConf

    hf_model = Path(cfg.launch.paths.hf_model)
    ckpt = actor_model_checkpoint(run / "checkpoints" / f"global_step_{step}" / "actor")
    base_settings = OmegaConf.to_container(cfg.launch.base_model, resolve=True)
    long_addition = OmegaConf.select(cfg, "launch.task.kind") == "long-addition"
    settings = (TM if long_addition else B).Settings.from_mapping(base_settings)
    with tempfile.TemporaryDirectory(prefix="final-eval-", dir=run) as tmp:
        out = Path(tmp) / "hf"
        cmd = [sys.executable, "-m", "tools.weights", "mcore-to-hf", str(ckpt), str(out), "--config", str(hf_model),
               "--layer-spec", layer_spec(), "--threads", "1"]  # fmt: skip
        r = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True)
        if r.returncode != 0:
            raise UserError(
                f"mcore-to-hf of {ckpt} failed:\n{r.stderr[-2000:]}", fix="run the command by hand"
            )
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (hf_model / name).is_file() and not (out / name).exists():
                shutil.copyfile(hf_model / name, out / name)
        import torch
        from transformers import AutoTokenizer, DeepseekV3ForCausalLM

        if settings.threads:
            torch.set_num_threads(settings.threads)
        tok = AutoTokenizer.from_pretrained(hf_model)
        model = DeepseekV3ForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
        if long_addition:  # the held-out problems, scored as trace_model scored the base model
            test = long_addition_split(OmegaConf.to_container(cfg.launch.task, resolve=True))[1]
            result = {"step": step, **TM.evaluate(model, tok, test, settings, seed=settings.seed + 1)}
        else:
            problems = Problems.read(Path(cfg.launch.paths.data) / "test.parquet")
            result = {"step": step, **B.evaluate(model, tok, problems, settings, seed=settings.seed + 1)}
    atomic.write_json(run / FINAL_FILE, result)
    return result


def run_final_eval(run: Path, cfg: Any, saved: int, out: TextIO) -> None:
    """make train's final evaluation (when the recipe asks for it and a checkpoint was saved), with its
    progress and time on `out`."""
    if not (cfg.launch.get("final_eval") and saved):
        return
    t = time.time()
    out.write(
        f"final evaluation: exporting the actor of step {saved} and scoring it on the held-out problems ...\n"
    )
    out.flush()
    final_eval(run, cfg, saved, log=lambda m: (out.write(m + "\n"), out.flush()))
    out.write(f"  ({time.time() - t:.0f} s)\n")
