"""The base model of the run that learns (recipes/tiny-learn.yaml): a tiny DeepSeek-V3 pre-trained here.

R1-Zero starts GRPO from a base model that already answers in the format and is right some of the time;
a random model never is, so its reward stays 0 and GRPO has nothing to work with. This module makes such a
base model for a toy task, on the CPU, deterministically from a seed, in a few minutes:

    task      "What is a + b?" for a, b in 0..operand_max (DeepScaleR-style JSON -> tools.data -> parquet,
              with the recipe's prompt template), held-out problems in test.parquet
    targets   <think> a + b = s </think> <answer> \\boxed{x} </answer><eos>, where s is the true sum and
              x is s with probability p_correct and otherwise uniform over 0..answer_max, drawn afresh
              every time: the model's own thinking holds the right answer, and what GRPO has to learn is
              to copy it into the answer. A model that learns this distribution answers right with
              probability p + (1 - p) / (answer_max + 1) when sampled at temperature 1, and almost always
              when greedy (the mode is the right sum)
    training  plain torch (AdamW, loss on the response tokens), the prompts rendered with the tokenizer's
              chat template exactly as verl renders them
    checks    greedy and sampled accuracy (mean over `eval_samples` samples per problem) on the held-out
              problems, scored by the project's reward (tools.reward), and the format rate

Everything about it is a setting (the recipe's `launch.base_model` and `launch.model_config`, which holds
the architecture so that another stack can ask for, e.g., the MLA head sizes vLLM's CPU kernel needs).
The model folder carries a stamp of those settings: a cache made with other settings is re-made, with a
message naming what changed, never reused. `base_model.json` beside the weights records the settings,
the pre-training time and the accuracies.

    python -m tools.miniature.assets tiny-learn [overrides]     # make (or check) it by hand
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tools import atomic
from tools.data.synthetic import tiny_tokenizer
from tools.errors import UserError

VERSION = 3  # 3: the thinking holds the sum (a + b = s). Bump when the pre-training procedure changes: every cached base model is re-made
RESULT = "base_model.json"
PROBLEM = re.compile(r"What is (\d+) \+ (\d+)\?")
Log = Callable[[str], None]


class BaseModelError(UserError):
    pass


def settings_from(cls: type, m: Mapping[str, Any], error: type[UserError] = BaseModelError) -> Any:
    """`launch.base_model` as the settings dataclass `cls` (this module's, or another base model's):
    an unknown key is refused, naming the keys there are and where they are explained."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(m) - known)
    if unknown:
        raise error(
            f"launch.base_model has unknown keys {unknown}",
            fix=f"use only {', '.join(sorted(known))} ({cls.__module__.replace('.', '/')}.py Settings)",
        )
    return cls(**dict(m))


def lr_schedule(lr: float, warmup: int, steps: int, lr_end: float) -> Callable[[int], float]:
    """The learning rate at each step: linear warm-up, then cosine decay to lr x lr_end at `steps`."""

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return lr * (lr_end + (1 - lr_end) * 0.5 * (1 + math.cos(math.pi * t)))

    return lr_at


def new_model(
    model_config: Mapping[str, Any], tok: Any, seed: int, threads: int
) -> tuple[Any, dict[str, Any]]:
    """A DeepseekV3ForCausalLM (float32, from `seed`) of `model_config` with `tok`'s special tokens, and
    the config.json it is saved with (`save`); `threads` torch threads when not 0."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = json.loads(json.dumps(dict(model_config)))  # transformers' config edits nested dicts in place
    cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    hf_cfg = DeepseekV3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    return DeepseekV3ForCausalLM(hf_cfg).to(torch.float32), cfg


def save(folder: Path, model: Any, cfg: Mapping[str, Any], result: Mapping[str, Any]) -> None:
    """The weights, config.json exactly as planned (DeepSeek-V3's own keys: verl and hf-to-mcore read it)
    and the result (base_model.json)."""
    model.save_pretrained(folder, safe_serialization=True)
    atomic.write_json(folder / "config.json", {**cfg, "architectures": ["DeepseekV3ForCausalLM"]})
    atomic.write_json(folder / RESULT, result)


@dataclass(frozen=True)
class Settings:
    """launch.base_model of the recipe (recipes/tiny-learn.yaml explains each)."""

    seed: int = 0
    steps: int = 500
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 20
    lr_end: float = 0.1  # the cosine decay ends at lr x lr_end
    weight_decay: float = 0.0
    p_correct: float = 0.3
    answer_max: int = 18
    eval_samples: int = 8
    eval_temperature: float = 1.0
    max_new_tokens: int = 32
    threads: int = 1  # torch threads: one is fastest for a model this small, above all on a shared machine

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> Settings:
        s = settings_from(cls, m)
        if not 0.0 <= s.p_correct <= 1.0:
            raise BaseModelError(f"launch.base_model.p_correct={s.p_correct}", fix="a probability in [0, 1]")
        if s.steps < 1 or s.batch_size < 1 or s.eval_samples < 1:
            raise BaseModelError(
                "launch.base_model.steps, batch_size and eval_samples must be >= 1",
                fix="set them to positive integers",
            )
        return s


# ---- the task ---------------------------------------------------------------------------------------


def addition_rows(operand_max: int) -> list[dict[str, str]]:
    """Every "What is a + b?" with a, b in 0..operand_max, as DeepScaleR rows (problem, answer, solution)."""
    return [
        {
            "problem": f"What is {a} + {b}?",
            "answer": str(a + b),
            "solution": f"{a} + {b} = \\boxed{{{a + b}}}",
        }
        for a in range(operand_max + 1)
        for b in range(operand_max + 1)
    ]


def response_text(a: int, b: int, answer: int) -> str:
    """The target response: the thinking holds the true sum, the answer is `answer` (right or not)."""
    return f"<think> {a} + {b} = {a + b} </think> <answer> \\boxed{{{answer}}} </answer>"


def operands(messages: Sequence[Mapping[str, str]]) -> tuple[int, int]:
    """(a, b) of a prompt's "What is a + b?" (the last user message)."""
    text = [m["content"] for m in messages if m["role"] == "user"][-1]
    m = PROBLEM.search(text)
    if not m:
        raise BaseModelError(
            f"prompt {text!r} is not an addition problem ('What is a + b?')",
            fix="the base model is pre-trained for the addition task: use the data launch.task makes",
        )
    return int(m.group(1)), int(m.group(2))


@dataclass
class Problems:
    prompts: list[list[dict[str, str]]]  # chat messages, as in the parquet's prompt column
    truths: list[str]

    @classmethod
    def read(cls, *parquets: Path) -> Problems:
        import pyarrow.parquet as pq

        prompts, truths = [], []
        for p in parquets:
            t = pq.read_table(p, columns=["prompt", "reward_model"])
            prompts += t.column("prompt").to_pylist()
            truths += [str(r["ground_truth"]) for r in t.column("reward_model").to_pylist()]
        return cls(prompts, truths)


# ---- pre-training -----------------------------------------------------------------------------------


def _prompt_ids(tok: Any, prompts: Sequence[Sequence[Mapping[str, str]]]) -> list[list[int]]:
    """Token ids of each prompt through the chat template with the generation prompt (as verl does)."""
    texts = [tok.apply_chat_template(list(p), add_generation_prompt=True, tokenize=False) for p in prompts]
    return tok(texts, add_special_tokens=False)["input_ids"]


def task_corpus(problems: Problems, s: Settings) -> list[str]:
    """Texts the tokenizer is trained on besides its fixed corpus: the prompts' instructions and problems
    and the target answers, so that every answer 0..answer_max is one token (see `answer_tokens`)."""
    texts = sorted({m["content"] for p in problems.prompts for m in p})
    for p in problems.prompts:
        a, b = operands(p)
        texts += [response_text(a, b, ans) for ans in range(s.answer_max + 1)]
    return texts


def answer_tokens(tok: Any, s: Settings) -> tuple[list[int], int]:
    """(token id of each answer 0..answer_max, its position in the response): the target at that
    position is a distribution over these tokens, so each answer must be exactly one token."""
    ref = tok(response_text(1, 1, 0), add_special_tokens=False)["input_ids"]
    ids, pos = [], None
    for ans in range(s.answer_max + 1):
        got = tok(response_text(1, 1, ans), add_special_tokens=False)["input_ids"]
        diff = [i for i, (x, y) in enumerate(zip(got, ref, strict=False)) if x != y]
        if len(got) != len(ref) or len(diff) > 1 or (diff and pos is not None and diff[0] != pos):
            raise BaseModelError(
                f"the answer {ans} is not one token of the tokenizer (response {tok.tokenize(response_text(1, 1, ans))})",
                fix="raise launch.model_config.vocab_size or lower launch.base_model.answer_max",
            )
        if diff:
            pos = diff[0]
        ids.append(got[pos] if pos is not None else got[0])
    if pos is None:
        raise BaseModelError("the answers 0..answer_max all tokenize alike", fix="answer_max must be >= 1")
    ids[0] = ref[pos]
    return ids, pos


def answer_positions(tok: Any, ops: Sequence[tuple[int, int]], s: Settings) -> tuple[list[int], list[int]]:
    """(token id of each answer 0..answer_max, the answer's position in each problem's response).

    The pre-training loss puts the answer distribution at one position of each response, so for every
    problem the responses with answers 0..answer_max must differ in exactly that one token, and that
    token must be the answer's own id (the one `answer_tokens` found): where the tokenizer merges the
    answer with what surrounds it in some problem (the thinking now holds the sum, whose tokens vary),
    the target would land on another token. That is refused (a misaligned answer token), never trained."""
    ids, _ = answer_tokens(tok, s)
    positions = []
    for a, b in ops:
        texts = [response_text(a, b, ans) for ans in range(s.answer_max + 1)]
        got = tok(texts, add_special_tokens=False)["input_ids"]
        ref = got[0]
        diff = sorted({i for g in got[1:] for i, (x, y) in enumerate(zip(g, ref, strict=False)) if x != y})
        lengths = {len(g) for g in got}
        tokens = [g[diff[0]] for g in got] if len(diff) == 1 and lengths == {len(ref)} else None
        if tokens != ids:
            shown = ", ".join(f"{ans}: {tok.tokenize(t)}" for ans, t in list(enumerate(texts))[:3])
            raise BaseModelError(
                f"misaligned answer token in the response to 'What is {a} + {b}?': its responses with answers "
                f"0..{s.answer_max} should differ in exactly one token, the answer's own "
                f"(positions that differ: {diff}, lengths {sorted(lengths)}; {shown}, ...)",
                fix="the tokenizer merges the answer with its neighbours: raise launch.model_config.vocab_size "
                "(the tokenizer is trained on the task's responses) or lower launch.base_model.answer_max",
            )
        positions.append(diff[0])
    return ids, positions


def pretrain(model: Any, tok: Any, problems: Problems, s: Settings, log: Log = print) -> dict[str, Any]:
    """Train `model` in place on the task's targets; returns what happened (loss, seconds).

    The answer's target is exact: the response is the same for every answer but one token, so at the
    answer's position the loss is the cross-entropy against the whole distribution (p_correct on a + b,
    1 - p_correct spread uniformly over 0..answer_max) instead of one sampled answer: the same optimum
    without the sampling noise, far fewer steps. The tokens after it are trained after an answer drawn
    from that distribution, so the model also closes the format after a wrong answer (what it samples
    most of the time), not only after the right one."""
    import torch

    prompt_ids = _prompt_ids(tok, problems.prompts)
    ops = [operands(p) for p in problems.prompts]
    answers, at = answer_positions(tok, ops, s)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    seqs, starts, answer_at, dists = [], [], [], []
    for ids, (a, b), here in zip(prompt_ids, ops, at, strict=True):
        resp = tok(response_text(a, b, a + b), add_special_tokens=False)["input_ids"] + [eos]
        seqs.append(ids + resp)
        starts.append(len(ids))
        answer_at.append(len(ids) + here)  # the answer token's index in the sequence
        dist = torch.full((s.answer_max + 1,), (1 - s.p_correct) / (s.answer_max + 1))
        if a + b <= s.answer_max:
            dist[a + b] += s.p_correct
        else:
            dist = dist / dist.sum()
        dists.append(dist)
    answer_ids = torch.tensor(answers)
    rng = random.Random(s.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay, betas=(0.9, 0.98))

    lr_at = lr_schedule(s.lr, s.warmup, s.steps, s.lr_end)

    def batch(rows: list[int]) -> tuple[Any, ...]:
        width = max(len(seqs[i]) for i in rows)
        ids = torch.full((len(rows), width), pad)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        hard = torch.full((len(rows), width), -100)
        for r, i in enumerate(rows):
            n = len(seqs[i])
            ids[r, :n] = torch.tensor(seqs[i])
            mask[r, :n] = 1
            hard[r, starts[i] : n] = ids[r, starts[i] : n]
        pos = torch.tensor([answer_at[i] for i in rows])  # the answer token's index in each row
        rows_t = torch.arange(len(rows))
        hard[rows_t, pos] = -100
        dist = torch.stack([dists[i] for i in rows])
        # the context of the tokens after the answer: an answer drawn from the target distribution
        drawn = torch.multinomial(dist, 1, generator=gen).squeeze(-1)
        ids[rows_t, pos] = answer_ids[drawn]
        return ids, mask, hard, pos, dist

    gen = torch.Generator().manual_seed(s.seed)
    full = list(range(len(seqs)))
    model.train()
    t0, c0 = time.perf_counter(), time.process_time()
    losses: list[float] = []
    for step in range(s.steps):
        ids, mask, hard, pos, dist = batch(
            full if s.batch_size >= len(full) else rng.sample(full, s.batch_size)
        )
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
        target = hard[:, 1:]
        token_nll = -logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)[target != -100]
        rows = torch.arange(ids.shape[0])
        answer_nll = -(dist * logp[rows, pos - 1][:, answer_ids]).sum(-1)
        loss = (token_nll.sum() + answer_nll.sum()) / (token_nll.numel() + answer_nll.numel())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % max(1, s.steps // 5) == 0 or step + 1 == s.steps:
            recent = losses[-max(1, s.steps // 10) :]
            log(
                f"  pre-training step {step + 1}/{s.steps}: loss {sum(recent) / len(recent):.4f} "
                f"({time.perf_counter() - t0:.0f} s)"
            )
    model.eval()
    tail = losses[-max(1, s.steps // 10) :]
    # the lowest loss this target allows: the answer distribution's entropy, spread over the response
    n_resp = sum(len(q) - st for q, st in zip(seqs, starts, strict=True))
    floor = -sum(float((d * d.clamp(min=1e-12).log()).sum()) for d in dists) / n_resp
    return {
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
        "final_loss": sum(tail) / len(tail),
        "loss_floor": floor,
    }


# ---- evaluation -------------------------------------------------------------------------------------


def generate(
    model: Any,
    tok: Any,
    prompts: Sequence[Sequence[Mapping[str, str]]],
    *,
    samples: int,
    greedy: bool,
    temperature: float = 1.0,
    max_new_tokens: int = 32,
    seed: int = 0,
    batch: int = 64,
) -> list[list[str]]:
    """`samples` decoded responses per prompt (left-padded batches, positions from the mask)."""
    import torch

    ids = _prompt_ids(tok, prompts)
    pad = tok.pad_token_id
    gen = torch.Generator().manual_seed(seed)
    flat = [(i, x) for i, x in enumerate(ids) for _ in range(1 if greedy else samples)]
    out: list[list[str]] = [[] for _ in prompts]
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    with torch.no_grad():
        for k in range(0, len(flat), batch):
            chunk = flat[k : k + batch]
            width = max(len(x) for _, x in chunk)
            inp = torch.tensor([[pad] * (width - len(x)) + x for _, x in chunk])
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for _, x in chunk])
            seq = model.generate(
                input_ids=inp,
                attention_mask=mask,
                do_sample=not greedy,
                temperature=temperature if not greedy else None,
                top_p=None,
                top_k=None,
                max_new_tokens=max_new_tokens,
                eos_token_id=tok.eos_token_id,
                pad_token_id=pad,
            )
            for (i, _), row in zip(chunk, seq[:, width:].tolist(), strict=True):
                out[i].append(tok.decode(row, skip_special_tokens=True))
    return out


def score(responses: list[list[str]], truths: Sequence[str]) -> dict[str, float]:
    """Accuracy and format rate (mean over every response) by the project's reward (tools.reward)."""
    # math_verify and mathruler: loaded when a model is scored, not when its cache is checked
    from tools.reward.pool import GradePool
    from tools.reward.score import score_responses

    flat = [(r, t) for rs, t in zip(responses, truths, strict=True) for r in rs]
    scored = score_responses([r for r, _ in flat], [t for _, t in flat], GradePool(workers=0))
    n = len(scored)
    return {
        "acc": sum(x["acc"] for x in scored) / n,
        "format": sum(x["format"] for x in scored) / n,
        "score": sum(x["score"] for x in scored) / n,
        "responses": n,
    }


def evaluate(
    model: Any, tok: Any, problems: Problems, s: Settings, seed: int | None = None
) -> dict[str, Any]:
    """Greedy (one per problem) and sampled (eval_samples per problem, eval_temperature) accuracy."""
    seed = s.seed if seed is None else seed
    greedy = generate(model, tok, problems.prompts, samples=1, greedy=True, max_new_tokens=s.max_new_tokens)
    sampled = generate(
        model, tok, problems.prompts, samples=s.eval_samples, greedy=False,
        temperature=s.eval_temperature, max_new_tokens=s.max_new_tokens, seed=seed,
    )  # fmt: skip
    g, m = score(greedy, problems.truths), score(sampled, problems.truths)
    return {
        "problems": len(problems.prompts),
        "greedy_acc": g["acc"],
        "greedy_format": g["format"],
        "sampled_acc": m["acc"],
        "sampled_format": m["format"],
        "samples_per_problem": s.eval_samples,
        "temperature": s.eval_temperature,
        "example": sampled[0][0] if sampled and sampled[0] else "",
    }


def expected_sampled_acc(s: Settings) -> float:
    """What a model that learned the target distribution exactly scores when sampled at temperature 1."""
    return s.p_correct + (1 - s.p_correct) / (s.answer_max + 1)


# ---- the cached folder ------------------------------------------------------------------------------


def wanted(s: Settings, model_config: Mapping[str, Any], data_digest: str) -> dict[str, Any]:
    """Everything the base model is made from: the stamp that decides whether a cache is reused."""
    return {
        "version": VERSION,
        "settings": asdict(s),
        "model_config": json.loads(json.dumps(dict(model_config))),  # deep copy: transformers edits it
        "data": data_digest,
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


def make(
    folder: Path,
    tmp: Path,
    settings: Settings,
    model_config: Mapping[str, Any],
    data: Path,
    log: Log = print,
) -> dict[str, Any]:
    """Tokenizer + pre-trained DeepseekV3ForCausalLM in `tmp` (the caller publishes it); returns the
    result written to tmp/base_model.json."""
    from transformers import AutoTokenizer

    vocab = int(model_config["vocab_size"])
    train = Problems.read(data / "train.parquet")
    test = Problems.read(data / "test.parquet")
    every = Problems(train.prompts + test.prompts, train.truths + test.truths)
    tiny_tokenizer(tmp, vocab_size=vocab, extra_corpus=task_corpus(every, settings))
    tok = AutoTokenizer.from_pretrained(tmp)
    model, cfg = new_model(model_config, tok, settings.seed, settings.threads)
    log(
        f"pre-training the base model ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
        f"seed {settings.seed}): {settings.steps} steps x {min(settings.batch_size, len(every.prompts))} sequences on "
        f"{len(every.prompts)} problems, answer right with probability {settings.p_correct}, else uniform "
        f"over 0..{settings.answer_max}"
    )
    t0 = time.perf_counter()
    train_stats = pretrain(model, tok, every, settings, log)
    t_eval = time.perf_counter()
    held_out = evaluate(model, tok, test, settings)
    result = {
        "settings": asdict(settings),
        "pretrain_seconds": round(train_stats["seconds"], 1),
        "pretrain_cpu_seconds": round(train_stats["cpu_seconds"], 1),
        "eval_seconds": round(time.perf_counter() - t_eval, 1),
        "final_loss": round(train_stats["final_loss"], 4),
        "loss_floor": round(train_stats["loss_floor"], 4),
        "held_out": held_out,
        "expected_sampled_acc": round(expected_sampled_acc(settings), 4),
        "made_in_seconds": round(time.perf_counter() - t0, 1),
    }
    save(tmp, model, cfg, result)
    log(summary(result))
    return result


def summary(result: Mapping[str, Any]) -> str:
    h = result["held_out"]
    return (
        f"base model: pre-trained in {result['pretrain_seconds']:.0f} s; on {h['problems']} held-out problems "
        f"greedy accuracy {h['greedy_acc']:.3f}, sampled accuracy {h['sampled_acc']:.3f} "
        f"(mean over {h['samples_per_problem']} samples a problem, T={h['temperature']}; a model of the target "
        f"distribution: {result['expected_sampled_acc']:.3f}), format {h['sampled_format']:.2f}"
    )


def read_result(model_dir: Path) -> dict[str, Any] | None:
    path = Path(model_dir) / RESULT
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
