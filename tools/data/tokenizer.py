"""Load a user's tokenizer folder: a missing folder, one without tokenizer files or a damaged file is one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.errors import UserError

FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
FIX = "point --tokenizer at a Hugging Face model folder with its tokenizer files (tokenizer.json, tokenizer_config.json)"


class TokenizerError(UserError):
    """A tokenizer folder that cannot be loaded: the message names it and what is wrong."""


def load_tokenizer(path: str | Path, flag: str = "--tokenizer") -> Any:
    """transformers' AutoTokenizer from a local folder (nothing downloaded), or a TokenizerError."""
    p = Path(path)
    if not p.is_dir():
        raise TokenizerError(f"{flag} {p}: no such folder", fix=FIX)
    if not any((p / f).is_file() for f in FILES):
        raise TokenizerError(f"{flag} {p}: no tokenizer files in it (none of {', '.join(FILES)})", fix=FIX)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a damaged file raises anything (JSON, sentencepiece, tokenizers)
        first = (str(e).strip().splitlines() or [""])[0]
        damaged = [f for f in FILES if (p / f).is_file() and (p / f).stat().st_size == 0]
        what = f"{p / damaged[0]} is empty" if damaged else f"{type(e).__name__}: {first}"
        raise TokenizerError(f"{flag} {p}: cannot load the tokenizer ({what})", fix=FIX) from None
