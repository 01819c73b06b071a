"""The base model of R1-Zero in miniature (recipes/tiny-zero.yaml): a tiny DeepSeek-V3 that can write a
step-by-step trace, but prefers not to.

R1-Zero's mechanism needs a base model that holds both behaviours, the short answer and the long
reasoning, with a prior for the short one: then RL has something to discover (that the long one pays on
hard problems), and a rise in accuracy can only come with a rise in length. This module pre-trains such
a model from scratch on the long-addition task (tools/tasks/long_addition.py), on the CPU, from a seed:

    data      fresh problems every step (n = 1..max_digits digits, uniform; never a held-out one in
              either order: a + b and b + a are the same sum to learn), each
              answered in the trace format with probability trace_share, else directly: the same share at
              every n, and every answer correct (no noise: the direct answer is wrong only where the model
              cannot compute it)
    training  plain torch, next-token loss on the response tokens, AdamW with warm-up and cosine decay;
              the budget (steps) is what keeps the direct answer of long numbers unlearned
    gates     measured on the held-out problems and recorded in base_model.json, each with its bound:
              forced-trace accuracy on the hardest bucket >= 0.85 (generation starts after <think>),
              forced-direct accuracy there <= 0.35 (after <answer>), the spontaneous trace rate within
              0.1 of trace_share (sampled at T=1), and every sampled response stopping by itself

The gates are checked, not enforced by tuning: a model that misses one is kept and the miss is said on
the terminal and in base_model.json (`gates`), since a run from it still shows what RL does.

The training loop, the model, generation and the cache stamp are the miniature's one pre-training
(tools/miniature/pretraining.py); this module gives it the task's data, loss and gates.

    python -m tools.miniature.assets tiny-zero [overrides]     # make (or check) it by hand
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tools.data.synthetic import tiny_tokenizer
from tools.errors import UserError
from tools.miniature import pretraining as P
from tools.tasks import long_addition as T

# 2: a held-out problem is kept out of the pre-training in both orders (a + b and b + a). Bump when the
# pre-training procedure changes: every cached base model is re-made
VERSION = 2
RESULT = P.RESULT
Log = P.Log
GATES = {  # name: (what, bound)
    "forced_trace_hardest": ("forced-trace accuracy on the hardest bucket", ">= 0.85"),
    "forced_direct_hardest": ("forced-direct accuracy on the hardest bucket", "<= 0.35"),
    "trace_rate_gap": ("|spontaneous trace rate - trace_share|", "<= 0.1"),
    "unstopped": ("sampled responses that hit max_new_tokens", "== 0"),
}


class TraceModelError(UserError):
    pass


@dataclass(frozen=True)
class Settings(P.PretrainSettings):
    """launch.base_model of recipes/tiny-zero.yaml (it explains each)."""

    seed: int = 0
    max_digits: int = 5
    trace_share: float = 0.25
    steps: int = 2000
    batch_size: int = 64
    micro_batch: int = 16  # sequences a forward pass, sorted by length (the loss is the step's token mean)
    # the loss weight of a trace's tokens after its first: the data holds the trace trace_share of the time
    # (the first token, the format's choice, weighs 1 in both formats, so the prior stays the share), while
    # its body, the part that has to be learned to be right, is learned trace_weight times faster
    trace_weight: float = 1.0
    lr: float = 2e-3
    warmup: int = 50
    lr_end: float = 0.05
    weight_decay: float = 0.0
    eval_samples: int = 4
    eval_temperature: float = 1.0
    max_new_tokens: int = 96
    threads: int = 1  # torch threads: one is fastest for a model this small, above all on a shared machine

    error = TraceModelError

    def check(self) -> None:
        if not 0.0 < self.trace_share < 1.0:
            raise TraceModelError(
                f"launch.base_model.trace_share={self.trace_share}",
                fix="a share strictly between 0 and 1: the base model needs both formats",
            )
        if self.steps < 1 or self.batch_size < 1 or self.max_digits < 1 or self.eval_samples < 1:
            raise TraceModelError(
                "launch.base_model.steps, batch_size, max_digits and eval_samples must be >= 1",
                fix="set them to positive integers",
            )


# ---- tokens -----------------------------------------------------------------------------------------


def make_tokenizer(folder: Path, vocab_size: int, s: Settings) -> Any:
    """A byte-level BPE with one token per digit, trained on the task's own texts (deterministic), and the
    format's tags as tokens of their own: the choice between the formats is the response's first token."""
    from transformers import AutoTokenizer

    texts = T.corpus(T.problems(s.seed + 20_000, range(1, s.max_digits + 1), 40))
    tiny_tokenizer(folder, vocab_size=vocab_size - len(T.TAGS), extra_corpus=texts, individual_digits=True)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_tokens(list(T.TAGS))
    if len(tok) > vocab_size:
        raise TraceModelError(
            f"the tokenizer has {len(tok)} tokens, more than launch.model_config.vocab_size {vocab_size}",
            fix=f"raise launch.model_config.vocab_size to at least {len(tok)}",
        )
    tok.chat_template = T.CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def response_ids(tok: Any, texts: Sequence[str]) -> list[list[int]]:
    return tok(list(texts), add_special_tokens=False)["input_ids"]


# ---- pre-training -----------------------------------------------------------------------------------


def draw_pretraining_problem(rng: random.Random, max_digits: int, excluded: set[T.Problem]) -> T.Problem:
    """One problem of 1..max_digits digits (the count uniform), never one of `excluded`; one-digit sums
    cannot be held out: there are 100 and the direct answer is a table to know."""
    while True:
        p = T.draw(rng, rng.randint(1, max_digits))
        if p.digits == 1 or p not in excluded:
            return p


def pretrain(model: Any, tok: Any, s: Settings, exclude: set[T.Problem], log: Log = print) -> dict[str, Any]:
    """Train `model` in place on the format mixture (tools/miniature/pretraining.py `train`), never on a
    problem of `exclude` in either order (T.both_orders); returns the loss and the time it took."""
    import torch

    rng = random.Random(s.seed)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    excluded = T.both_orders(exclude)

    def batch() -> list[tuple[Any, Any, Any, Any]]:
        """The step's sequences, sorted by length into micro-batches of `micro_batch` (a trace is several
        times a direct answer's length: padding every row to the longest trace would triple the work)."""
        ps = [draw_pretraining_problem(rng, s.max_digits, excluded) for _ in range(s.batch_size)]
        fmts = ["trace" if rng.random() < s.trace_share else "direct" for _ in ps]
        prompts = P.prompt_ids(tok, [p.messages() for p in ps])
        resps = response_ids(tok, [T.response(p, f) for p, f in zip(ps, fmts, strict=True)])
        rows = sorted(
            ((q, q + r + [eos], f) for q, r, f in zip(prompts, resps, fmts, strict=True)),
            key=lambda x: len(x[1]),
        )
        out = []
        for k in range(0, len(rows), s.micro_batch):
            chunk = rows[k : k + s.micro_batch]
            width = max(len(x) for _, x, _ in chunk)
            ids = torch.full((len(chunk), width), pad)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            labels = torch.full((len(chunk), width), -100)
            weight = torch.zeros((len(chunk), width))
            for i, (q, x, f) in enumerate(chunk):
                ids[i, : len(x)] = torch.tensor(x)
                mask[i, : len(x)] = 1
                labels[i, len(q) : len(x)] = ids[i, len(q) : len(x)]
                # the first response token (the format's choice) weighs 1 in both formats, so the prior is
                # the share; the rest of a trace weighs trace_weight (see Settings)
                weight[i, len(q) : len(x)] = s.trace_weight if f == "trace" else 1.0
                weight[i, len(q)] = 1.0
            out.append((ids, mask, labels, weight))
        return out

    def step_loss(step: int) -> float:
        micro = batch()
        tokens = sum(int((labels[:, 1:] != -100).sum()) for _, _, labels, _ in micro)
        total = 0.0
        for ids, mask, labels, weight in micro:  # weighted sum over the step's response tokens / their count
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            target = labels[:, 1:]
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none"
            )
            loss = (nll * weight[:, 1:].reshape(-1)).sum() / tokens
            loss.backward()
            total += loss.item()
        return total

    return P.train(model, s, step_loss, log)


# ---- evaluation -------------------------------------------------------------------------------------


def generate(
    model: Any, tok: Any, ps: Sequence[T.Problem], *, force: str = "", **how: Any
) -> list[list[tuple[str, int, bool]]]:
    """Per problem, (text, response tokens, stopped) decoded after the prompt and `force` (the opening of a
    format; the text includes it), by the miniature's one generation (pretraining.generate)."""
    return P.generate(model, tok, [p.messages() for p in ps], force=force, batch=256, **how)


def _rates(
    ps: Sequence[T.Problem], outs: Sequence[Sequence[tuple[str, int, bool]]]
) -> dict[str, dict[str, float]]:
    """Per bucket (digits): accuracy, trace rate, mean response tokens, share stopped."""
    by: dict[int, list[tuple[dict[str, float], int, bool]]] = {}
    for p, rs in zip(ps, outs, strict=True):
        for text, n, stopped in rs:
            by.setdefault(p.digits, []).append((T.score(text, p.answer), n, stopped))
    return {
        str(d): {
            "acc": round(sum(x["acc"] for x, _, _ in v) / len(v), 4),
            "trace": round(sum(x["trace"] for x, _, _ in v) / len(v), 4),
            "length": round(sum(n for _, n, _ in v) / len(v), 2),
            "stopped": round(sum(st for _, _, st in v) / len(v), 4),
            "responses": len(v),
        }
        for d, v in sorted(by.items())
    }


def evaluate(
    model: Any, tok: Any, ps: Sequence[T.Problem], s: Settings, seed: int | None = None
) -> dict[str, Any]:
    """The gates' measurements and the per-bucket picture: forced trace, forced direct, spontaneous
    greedy and sampled (eval_samples a problem at eval_temperature)."""
    seed = s.seed if seed is None else seed
    common = {"max_new_tokens": s.max_new_tokens}
    forced_trace = _rates(ps, generate(model, tok, ps, force=T.prefix("trace"), **common))
    forced_direct = _rates(ps, generate(model, tok, ps, force=T.prefix("direct"), **common))
    greedy = _rates(ps, generate(model, tok, ps, **common))
    sampled_out = generate(
        model, tok, ps, samples=s.eval_samples, temperature=s.eval_temperature, seed=seed, **common
    )
    sampled = _rates(ps, sampled_out)
    hardest = str(max(p.digits for p in ps))
    n_sampled = sum(b["responses"] for b in sampled.values())
    trace_rate = sum(b["trace"] * b["responses"] for b in sampled.values()) / n_sampled
    measured = {
        "forced_trace_hardest": forced_trace[hardest]["acc"],
        "forced_direct_hardest": forced_direct[hardest]["acc"],
        "trace_rate_gap": round(abs(trace_rate - s.trace_share), 4),
        "unstopped": sum(round((1 - b["stopped"]) * b["responses"]) for b in sampled.values()),
    }
    examples = {}
    for p, rs in zip(ps, sampled_out, strict=True):
        examples.setdefault(str(p.digits), [p.text, [t for t, _, _ in rs]])
    return {
        "problems": len(ps),
        "hardest_bucket": int(hardest),
        "trace_rate": round(trace_rate, 4),
        "gates": {
            k: {"what": GATES[k][0], "bound": GATES[k][1], "value": v, "met": met(k, v)}
            for k, v in measured.items()
        },
        "forced_trace": forced_trace,
        "forced_direct": forced_direct,
        "greedy": greedy,
        "sampled": sampled,
        "samples_per_problem": s.eval_samples,
        "temperature": s.eval_temperature,
        "examples": examples,
    }


def met(gate: str, value: float) -> bool:
    op, bound = GATES[gate][1].split()
    return {">=": value >= float(bound), "<=": value <= float(bound), "==": value == float(bound)}[op]


# ---- the cached folder ------------------------------------------------------------------------------


def wanted(s: Settings, model_config: Mapping[str, Any], data_digest: str) -> dict[str, Any]:
    """Everything the base model is made from: the stamp that decides whether a cache is reused."""
    return P.wanted(VERSION, s, model_config, data_digest, task="long-addition")


def make(
    tmp: Path, s: Settings, model_config: Mapping[str, Any], test: Sequence[T.Problem], log: Log = print
) -> dict[str, Any]:
    """Tokenizer + pre-trained DeepseekV3ForCausalLM in `tmp` (the caller publishes it); returns the
    result written to tmp/base_model.json."""
    tok = make_tokenizer(tmp, int(model_config["vocab_size"]), s)
    model, cfg = P.new_model(model_config, tok, s.seed, s.threads)
    log(
        f"pre-training the base model ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
        f"seed {s.seed}): {s.steps} steps x {s.batch_size} long-addition problems of 1..{s.max_digits} digits, "
        f"{s.trace_share:.0%} answered with the step-by-step trace, the rest directly"
    )
    stats = pretrain(model, tok, s, set(test), log)
    t_eval = time.perf_counter()
    held = evaluate(model, tok, test, s)
    result = {
        "task": "long-addition",
        "settings": asdict(s),
        "pretrain_seconds": round(stats["seconds"], 1),
        "pretrain_cpu_seconds": round(stats["cpu_seconds"], 1),
        "final_loss": round(stats["final_loss"], 4),
        "eval_seconds": round(time.perf_counter() - t_eval, 1),
        "held_out": held,
    }
    P.save(tmp, model, cfg, result)
    log(summary(result))
    return result


def summary(result: Mapping[str, Any]) -> str:
    h = result["held_out"]
    gates = "; ".join(
        f"{g['what']} {g['value']} ({'met' if g['met'] else 'NOT met'}: {g['bound']})"
        for g in h["gates"].values()
    )
    return (
        f"base model: pre-trained in {result['pretrain_seconds']:.0f} s; on {h['problems']} held-out problems "
        f"spontaneous trace rate {h['trace_rate']:.2f} (T={h['temperature']}); {gates}"
    )


read_result = P.read_result
