"""The base model of the run that learns (recipes/tiny-learn.yaml): a tiny DeepSeek-V3 pre-trained here.

R1-Zero starts GRPO from a base model that already answers in the format and is right some of the time;
a random model never is, so its reward stays 0 and GRPO has nothing to work with. This module makes such a
base model for a toy task, on the CPU, deterministically from a seed, in a few minutes:

    task      "What is a + b?" for a, b in 0..operand_max (DeepScaleR-style JSON -> tools.data -> parquet,
              with the recipe's prompt template), held-out problems in test.parquet
              (tools/tasks/addition.py)
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

Made of: the task (tools/tasks/addition.py), the one pre-training and evaluation
(tools/miniature/pretraining.py) and, here, what is this model's own: the settings, the answer's exact
target distribution, the held-out measures. It is pre-trained on the training problems alone
(train.parquet): the held-out ones (test.parquet), which the validation scores, it never sees.

    python -m tools.miniature.assets tiny-learn [overrides]     # make (or check) it by hand
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tools.data.synthetic import tiny_tokenizer
from tools.errors import UserError
from tools.miniature import pretraining as P
from tools.tasks.addition import Problems, operands, response_text

# 4: pre-trained (and its tokenizer trained) on the training problems alone, never the held-out ones;
# 3: the thinking holds the sum (a + b = s). Bump when the pre-training procedure changes: every cached
# base model is re-made
VERSION = 4
RESULT = P.RESULT
Log = P.Log


class BaseModelError(UserError):
    pass


@dataclass(frozen=True)
class Settings(P.PretrainSettings):
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

    error = BaseModelError

    def check(self) -> None:
        if not 0.0 <= self.p_correct <= 1.0:
            raise BaseModelError(
                f"launch.base_model.p_correct={self.p_correct}", fix="a probability in [0, 1]"
            )
        if self.steps < 1 or self.batch_size < 1 or self.eval_samples < 1:
            raise BaseModelError(
                "launch.base_model.steps, batch_size and eval_samples must be >= 1",
                fix="set them to positive integers",
            )


# ---- tokens -----------------------------------------------------------------------------------------


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


def answer_positions(tok: Any, ops: list[tuple[int, int]], s: Settings) -> tuple[list[int], list[int]]:
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


# ---- pre-training -----------------------------------------------------------------------------------


def pretrain(model: Any, tok: Any, problems: Problems, s: Settings, log: Log = print) -> dict[str, Any]:
    """Train `model` in place on the task's targets (tools/miniature/pretraining.py `train`); returns what
    happened (loss, its floor, seconds).

    The answer's target is exact: the response is the same for every answer but one token, so at the
    answer's position the loss is the cross-entropy against the whole distribution (p_correct on a + b,
    1 - p_correct spread uniformly over 0..answer_max) instead of one sampled answer: the same optimum
    without the sampling noise, far fewer steps. The tokens after it are trained after an answer drawn
    from that distribution, so the model also closes the format after a wrong answer (what it samples
    most of the time), not only after the right one."""
    import torch

    prompt_ids = P.prompt_ids(tok, problems.prompts)
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
    gen = torch.Generator().manual_seed(s.seed)
    full = list(range(len(seqs)))

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

    def step_loss(step: int) -> float:
        ids, mask, hard, pos, dist = batch(
            full if s.batch_size >= len(full) else rng.sample(full, s.batch_size)
        )
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
        target = hard[:, 1:]
        token_nll = -logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)[target != -100]
        rows = torch.arange(ids.shape[0])
        answer_nll = -(dist * logp[rows, pos - 1][:, answer_ids]).sum(-1)
        loss = (token_nll.sum() + answer_nll.sum()) / (token_nll.numel() + answer_nll.numel())
        loss.backward()
        return loss.item()

    stats = P.train(model, s, step_loss, log)
    # the lowest loss this target allows: the answer distribution's entropy, spread over the response
    n_resp = sum(len(q) - st for q, st in zip(seqs, starts, strict=True))
    floor = -sum(float((d * d.clamp(min=1e-12).log()).sum()) for d in dists) / n_resp
    return {**stats, "loss_floor": floor}


# ---- evaluation -------------------------------------------------------------------------------------


def score(responses: list[list[str]], truths: list[str]) -> dict[str, float]:
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


def _texts(model: Any, tok: Any, problems: Problems, s: Settings, **how: Any) -> list[list[str]]:
    outs = P.generate(model, tok, problems.prompts, max_new_tokens=s.max_new_tokens, batch=64, **how)
    return [[g.text for g in gs] for gs in outs]


def evaluate(
    model: Any, tok: Any, problems: Problems, s: Settings, seed: int | None = None
) -> dict[str, Any]:
    """Greedy (one per problem) and sampled (eval_samples per problem, eval_temperature) accuracy."""
    import torch

    seed = s.seed if seed is None else seed
    # the sampling's torch seed, drawn from `seed` (as this model's evaluation always drew it)
    torch_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(seed)))
    greedy = _texts(model, tok, problems, s)
    sampled = _texts(
        model, tok, problems, s, samples=s.eval_samples, temperature=s.eval_temperature, seed=torch_seed
    )
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
    return P.wanted(VERSION, s, model_config, data_digest)


def make(
    tmp: Path, settings: Settings, model_config: Mapping[str, Any], data: Path, log: Log = print
) -> dict[str, Any]:
    """Tokenizer + DeepseekV3ForCausalLM pre-trained on data/train.parquet alone, in `tmp` (the caller
    publishes it), scored on data/test.parquet, the held-out problems it never saw; returns the result
    written to tmp/base_model.json."""
    from transformers import AutoTokenizer

    vocab = int(model_config["vocab_size"])
    train = Problems.read(data / "train.parquet")
    test = Problems.read(data / "test.parquet")
    tiny_tokenizer(tmp, vocab_size=vocab, extra_corpus=task_corpus(train, settings))
    tok = AutoTokenizer.from_pretrained(tmp)
    model, cfg = P.new_model(model_config, tok, settings.seed, settings.threads)
    log(
        f"pre-training the base model ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
        f"seed {settings.seed}): {settings.steps} steps x {min(settings.batch_size, len(train.prompts))} sequences "
        f"on the {len(train.prompts)} training problems ({len(test.prompts)} held out), answer right with "
        f"probability {settings.p_correct}, else uniform over 0..{settings.answer_max}"
    )
    t0 = time.perf_counter()
    train_stats = pretrain(model, tok, train, settings, log)
    t_eval = time.perf_counter()
    held_out = evaluate(model, tok, test, settings)
    result = {
        "settings": asdict(settings),
        "pretrained_on": len(train.prompts),
        "pretrain_seconds": round(train_stats["seconds"], 1),
        "pretrain_cpu_seconds": round(train_stats["cpu_seconds"], 1),
        "eval_seconds": round(time.perf_counter() - t_eval, 1),
        "final_loss": round(train_stats["final_loss"], 4),
        "loss_floor": round(train_stats["loss_floor"], 4),
        "held_out": held_out,
        "expected_sampled_acc": round(expected_sampled_acc(settings), 4),
        "made_in_seconds": round(time.perf_counter() - t0, 1),
    }
    P.save(tmp, model, cfg, result)
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


read_result = P.read_result
