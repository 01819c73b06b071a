"""Small synthetic stand-ins for the public datasets and a tiny tokenizer, for tests and benches
(no hub access needed). Rows follow each dataset's published layout.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from tools.data.template import R1_ZERO_INSTRUCTION

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def problem_text(i: int, rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    filler = " ".join(
        rng.choice(["Consider", "the", "sum", "of", "two", "numbers", "where", "each", "is", "positive"])
        for _ in range(rng.randint(5, 60))
    )
    return f"Problem {i}: {filler}. What is ${a} + {b}$?", str(a + b)


def deepscaler_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        p, a = problem_text(i, rng)
        rows.append({"problem": p, "answer": a, "solution": f"Adding gives $\\boxed{{{a}}}$."})
    return rows


def math_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        p, a = problem_text(i, rng)
        rows.append(
            {
                "problem": p,
                "level": f"Level {rng.randint(1, 5)}",
                "type": "Algebra",
                "solution": f"So it is $\\boxed{{\\frac{{{a}}}{{1}}}}$.",
            }
        )
    return rows


def gsm8k_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        p, a = problem_text(i, rng)
        rows.append({"question": p, "answer": f"Add them: <<{a}={a}>>.\n#### {int(a):,}"})
    return rows


def orz_rows(n: int, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        p, a = problem_text(i, rng)
        rows.append([{"from": "human", "value": p}, {"from": "assistant", "ground_truth": {"value": a}}])
    return rows


def write_json(rows: list, path: Path, lines: bool = False) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        if lines:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        else:
            json.dump(rows, f, indent=1)
    return path


def tiny_tokenizer(
    out: Path, vocab_size: int = 600, extra_corpus: Sequence[str] = (), individual_digits: bool = False
) -> Path:
    """A small byte-level BPE tokenizer (any text round-trips) with a ChatML-like chat template,
    saved as a transformers folder. `vocab_size` bounds the vocabulary (specials included);
    `extra_corpus` adds texts to the fixed training corpus (a task's own prompts and answers);
    `individual_digits` makes every digit a token of its own (arithmetic tasks: no merged numbers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if individual_digits
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [R1_ZERO_INSTRUCTION, "system user assistant", *(r["problem"] for r in deepscaler_rows(50))]
    corpus += list(extra_corpus)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return out
