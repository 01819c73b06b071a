"""The one pre-training and evaluation of the miniature's models, that each task's base model plugs into
(tools/miniature/addition_model.py for tiny-learn, trace_model.py for tiny-zero; assets.py's random-init
model uses the model and save parts):

    settings    `PretrainSettings.from_mapping`: the recipe's launch.base_model as a task's settings
                dataclass, an unknown key refused naming the keys there are
    model       `new_model`: a DeepseekV3ForCausalLM of launch.model_config from a seed; `save`: the
                weights, config.json exactly as planned and the result (base_model.json)
    training    `train`: AdamW, linear warm-up then cosine decay, gradient clipping, progress every tenth
                of the steps; the task gives each step's loss (its data, its targets, backward done)
    evaluation  `prompt_ids` (the chat template as verl renders it) and `generate` (left-padded batches,
                greedy or sampled, optionally after a forced opening): the task scores what comes back
    cache       `wanted` (the stamp that decides whether a cached model is reused), `differences` (what
                changed, said when it is re-made), `read_result`
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, NamedTuple

from tools import atomic
from tools.errors import UserError
from tools.records import read_json

RESULT = "base_model.json"
Log = Callable[[str], None]
Messages = Sequence[Mapping[str, str]]


class PretrainSettings:
    """Base of a base model's settings (a frozen dataclass of launch.base_model's keys): `error` is the
    task's error class, `check` refuses values the task cannot use."""

    error: type[UserError] = UserError

    def check(self) -> None:
        """Raise `error` for a value the task cannot use (the subclass says which)."""

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> Any:
        """`launch.base_model` as this settings class: an unknown key is refused, naming the keys there
        are and where they are explained; then `check`."""
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # a dataclass subclass
        unknown = sorted(set(m) - known)
        if unknown:
            raise cls.error(
                f"launch.base_model has unknown keys {unknown}",
                fix=f"use only {', '.join(sorted(known))} ({cls.__module__.replace('.', '/')}.py Settings)",
            )
        s = cls(**dict(m))
        s.check()
        return s


# ---- the model --------------------------------------------------------------------------------------


def new_model(
    model_config: Mapping[str, Any], tok: Any, seed: int, threads: int, dtype: str = "float32"
) -> tuple[Any, dict[str, Any]]:
    """A DeepseekV3ForCausalLM (`dtype`, from `seed`) of `model_config` with `tok`'s special tokens, and
    the config.json it is saved with (`save`); `threads` torch threads when not 0."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = json.loads(json.dumps(dict(model_config)))  # transformers' config edits nested dicts in place
    cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    hf_cfg = DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    return DeepseekV3ForCausalLM(hf_cfg).to(getattr(torch, dtype)), cfg


def save(folder: Path, model: Any, cfg: Mapping[str, Any], result: Mapping[str, Any] | None = None) -> None:
    """The weights, config.json exactly as planned (DeepSeek-V3's own keys: verl and hf-to-mcore read it)
    and, for a pre-trained model, the result (base_model.json)."""
    model.save_pretrained(folder, safe_serialization=True)
    atomic.write_json(folder / "config.json", {**cfg, "architectures": ["DeepseekV3ForCausalLM"]})
    if result is not None:
        atomic.write_json(folder / RESULT, result)


# ---- training ---------------------------------------------------------------------------------------


def lr_schedule(lr: float, warmup: int, steps: int, lr_end: float) -> Callable[[int], float]:
    """The learning rate at each step: linear warm-up, then cosine decay to lr x lr_end at `steps`."""

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return lr * (lr_end + (1 - lr_end) * 0.5 * (1 + math.cos(math.pi * t)))

    return lr_at


def train(model: Any, s: Any, step_loss: Callable[[int], float], log: Log = print) -> dict[str, Any]:
    """Train `model` in place for s.steps steps (AdamW with s.lr, s.warmup, s.lr_end, s.weight_decay);
    `step_loss(step)` draws the step's data, computes the loss, calls backward and returns the loss.
    Returns the time it took and the mean loss over the last tenth of the steps."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.98))
    lr_at = lr_schedule(s.lr, s.warmup, s.steps, s.lr_end)
    model.train()
    t0, c0 = time.perf_counter(), time.process_time()
    losses: list[float] = []
    every = max(1, s.steps // 10)
    for step in range(s.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        losses.append(step_loss(step))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % every == 0:
            recent = losses[-every:]
            elapsed = time.perf_counter() - t0
            eta = elapsed / (step + 1) * (s.steps - step - 1)
            log(
                f"  pre-training step {step + 1}/{s.steps}: loss {sum(recent) / len(recent):.4f} "
                f"({elapsed:.0f} s, ~{eta:.0f} s left)"
            )
    model.eval()
    tail = losses[-every:]
    return {
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
        "final_loss": sum(tail) / len(tail),
    }


# ---- evaluation -------------------------------------------------------------------------------------


def prompt_ids(tok: Any, prompts: Sequence[Messages]) -> list[list[int]]:
    """Token ids of each prompt through the chat template with the generation prompt (as verl does)."""
    texts = [tok.apply_chat_template(list(p), add_generation_prompt=True, tokenize=False) for p in prompts]
    return tok(texts, add_special_tokens=False)["input_ids"]


class Generation(NamedTuple):
    text: str  # the forced opening and the decoded response (special tokens left out)
    tokens: int  # the response's tokens, the forced ones and the end-of-sequence token included
    stopped: bool  # the model ended it (end-of-sequence) before max_new_tokens


def generate(
    model: Any,
    tok: Any,
    prompts: Sequence[Messages],
    *,
    samples: int = 1,
    temperature: float | None = None,
    force: str = "",
    max_new_tokens: int = 32,
    seed: int = 0,
    batch: int = 64,
) -> list[list[Generation]]:
    """Per prompt, `samples` responses decoded after the prompt and `force` (the opening of a format),
    in left-padded batches of `batch` (positions from the mask); greedy when temperature is None."""
    import torch

    forced = tok([force], add_special_tokens=False)["input_ids"][0] if force else []
    ids = [q + forced for q in prompt_ids(tok, prompts)]
    pad, eos = tok.pad_token_id, tok.eos_token_id
    flat = [(i, x) for i, x in enumerate(ids) for _ in range(samples)]
    out: list[list[Generation]] = [[] for _ in prompts]
    torch.manual_seed(seed)
    with torch.no_grad():
        for k in range(0, len(flat), batch):
            chunk = flat[k : k + batch]
            width = max(len(x) for _, x in chunk)
            inp = torch.tensor([[pad] * (width - len(x)) + x for _, x in chunk])
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for _, x in chunk])
            seq = model.generate(
                input_ids=inp,
                attention_mask=mask,
                do_sample=temperature is not None,
                temperature=temperature,
                top_p=None,
                top_k=None,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
            )
            for (i, _), row in zip(chunk, seq[:, width:].tolist(), strict=True):
                stopped = eos in row
                body = row[: row.index(eos)] if stopped else row
                text = force + tok.decode(body, skip_special_tokens=True)
                out[i].append(Generation(text, len(forced) + len(body) + stopped, stopped))
    return out


# ---- the cached folder ------------------------------------------------------------------------------


def wanted(
    version: int, s: Any, model_config: Mapping[str, Any], data_digest: str, **more: Any
) -> dict[str, Any]:
    """Everything a base model is made from: the stamp that decides whether a cache is reused."""
    return {
        "version": version,
        "settings": asdict(s),
        "model_config": json.loads(json.dumps(dict(model_config))),  # deep copy: transformers edits it
        "data": data_digest,
        **more,
    }


def differences(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """'key: old -> new' for every leaf that differs (nested dicts followed)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {a} -> {b}")
    return out


def read_result(model_dir: Path) -> dict[str, Any] | None:
    return read_json(Path(model_dir) / RESULT)
