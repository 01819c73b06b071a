"""The embedded default run's inputs, made locally, deterministically and cached (nothing downloaded).

Where they go and the model's shape come from the recipe (`launch.paths`, `launch.model_config` of
recipes/model/tiny-deepseek-v3.yaml):

    paths.hf_model   a tiny DeepSeek-V3-architecture HF model (MLA + MoE, random init, seeded) with a
                     byte-level BPE tokenizer trained offline and a chat template; with `launch.base_model`
                     (recipes/tiny-learn.yaml) a base model pre-trained here instead (tools/miniature/addition_model.py)
    paths.raw_data   DeepScaleR-format problems with known answers (JSON): synthetic sums by default, or the
                     task `launch.task` names (`addition`: every "What is a + b?")
    paths.data       train.parquet / test.parquet made from it by the project's data tool
    paths.mcore      the model as a Megatron torch_dist checkpoint, made by the project's hf-to-mcore

Each part is built in a temporary folder beside its destination and renamed into place when complete,
with a stamp of what it was made from (the settings themselves, not only a digest). A part made from
other settings (the recipe's model, task or base-model settings, or ASSETS_VERSION) is re-made with a
message naming what changed, and nothing else is. `python -m tools.miniature.assets [RECIPE]` makes them
by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools import atomic
from tools.data.synthetic import deepscaler_rows, tiny_tokenizer, write_json
from tools.errors import UserError, run_cli
from tools.miniature import addition_model as B
from tools.miniature import pretraining as P
from tools.miniature import trace_model as TM
from tools.tasks import long_addition as T
from tools.tasks.addition import addition_rows

if TYPE_CHECKING:
    from omegaconf import DictConfig

ASSETS_VERSION = 1
# the long-addition split's version (long_addition_split); 2: a held-out problem is out of train in both orders
LONG_ADDITION_SPLIT = 2
SEED = 1234
N_PROBLEMS = 64
N_TEST = 8
STAMP = ".assets-stamp.json"
Log = Callable[[str], None]


def model_config(vocab_size: int, **overrides: Any) -> dict[str, Any]:
    """transformers' DeepseekV3 config scaled down: MLA with q/kv LoRA, one dense layer then MoE layers
    with a shared expert, grouped sigmoid routing with a bias, YaRN rope; no MTP, no FP8.
    `overrides` (the recipe's launch.model_config) replace the defaults below."""
    from tools.weights.synthetic import tiny_config  # torch, safetensors: only to make a model

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


TASKS = ("addition", "long-addition")


@dataclass(frozen=True)
class Assets:
    hf_model: Path
    raw_data: Path
    data: Path
    mcore: Path
    model_overrides: Mapping[str, Any]
    task: Mapping[str, Any] | None = None  # launch.task: the problems (None: the synthetic default)
    base_model: Mapping[str, Any] | None = None  # launch.base_model: pre-train (None: random init)

    @classmethod
    def from_launch(cls, launch: Any) -> Assets:
        """From a composed recipe's `launch` section (tools.recipes.recipe.compose(...).launch)."""
        from omegaconf import OmegaConf

        p = launch.paths
        overrides = OmegaConf.to_container(launch.get("model_config") or {}, resolve=True)
        overrides.pop("model_type", None)
        task = OmegaConf.to_container(launch.task, resolve=True) if launch.get("task") else None
        base = OmegaConf.to_container(launch.base_model, resolve=True) if launch.get("base_model") else None
        return cls(Path(p.hf_model), Path(p.raw_data), Path(p.data), Path(p.mcore), overrides, task, base)

    @property
    def train_parquet(self) -> Path:
        return self.data / "train.parquet"

    @property
    def test_parquet(self) -> Path:
        return self.data / "test.parquet"


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _stale(folder: Path, want: Mapping[str, Any]) -> str | None:
    """None when `folder` was made from exactly `want`; otherwise why it must be (re-)made."""
    stamp = folder / STAMP
    if not stamp.is_file():
        return "re-making it: its stamp is missing" if folder.exists() else "missing"
    try:
        old = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return "re-making it: its stamp is unreadable"
    if old.get("digest") == _digest(want):
        return None
    made = old.get("made_from")
    if not isinstance(made, dict):
        return "re-making it: it was made by an older version of tools/miniature/assets.py"
    diff = P.differences(made, want)
    shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
    return f"re-making it: it was made with other settings ({shown})"


def _announce(folder: Path, reason: str, what: str, log: Log) -> None:
    if reason == "missing":
        log(f"making {what} in {folder}")
    else:
        log(f"{folder}: {reason}; making {what}")


def _stamp_digest(folder: Path) -> str:
    return json.loads((folder / STAMP).read_text())["digest"]


def _publish(tmp: Path, folder: Path, want: Mapping[str, Any]) -> None:
    atomic.write_json(tmp / STAMP, {"digest": _digest(want), "version": ASSETS_VERSION, "made_from": want})
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _partial(folder: Path, mkdir: bool = True) -> Iterator[Path]:
    """<folder>.partial, made afresh, where an asset is written before `_publish` renames it into place;
    removed again when the making fails or is stopped (Ctrl-C, SIGTERM), so nothing half-made stays."""
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    if mkdir:
        tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def make_model(a: Assets, log: Log = print) -> bool:
    """Tokenizer + DeepseekV3ForCausalLM: random init (seeded), or the pre-trained base model when the
    recipe has launch.base_model (made from the data, so make_data runs first). True when (re)built."""
    vocab = int(a.model_overrides.get("vocab_size", 512))
    if a.base_model is not None and (a.task or {}).get("kind") == "long-addition":
        return _make_trace_model(a, vocab, log)
    if a.base_model is not None:
        return _make_base_model(a, vocab, log)
    want = {"v": ASSETS_VERSION, "seed": SEED, "vocab": vocab, "overrides": dict(a.model_overrides)}
    reason = _stale(a.hf_model, want)
    if reason is None:
        return False
    # only when (re)making: the launcher that finds the model cached stays without torch for the whole run
    from transformers import AutoTokenizer

    _announce(
        a.hf_model, reason, f"the tiny DeepSeek-V3 model and its tokenizer (random init, seed {SEED})", log
    )
    with _partial(a.hf_model) as tmp:
        # the tokenizer is trained offline on a fixed corpus: deterministic; it never exceeds `vocab`
        tiny_tokenizer(tmp, vocab_size=vocab)
        tok = AutoTokenizer.from_pretrained(tmp)
        cfg = model_config(**{**a.model_overrides, "vocab_size": vocab})
        # the recipe's torch_dtype (float32 unless it says otherwise; vLLM's CPU MLA runs bf16)
        model, cfg = P.new_model(cfg, tok, SEED, threads=0, dtype=str(cfg.get("torch_dtype") or "float32"))
        P.save(tmp, model, cfg)
        _publish(tmp, a.hf_model, want)
    return True


def _make_base_model(a: Assets, vocab: int, log: Log) -> bool:
    """tiny-learn's base model (tools/miniature/addition_model.py), made from its settings and the data."""
    settings = B.Settings.from_mapping(a.base_model or {})
    cfg = model_config(**{**a.model_overrides, "vocab_size": vocab})
    return _pretrained(
        a, B, B.wanted(settings, cfg, _stamp_digest(a.data)), "a few minutes",
        lambda tmp: B.make(tmp, settings, cfg, a.data, log), log,
    )  # fmt: skip


def _make_trace_model(a: Assets, vocab: int, log: Log) -> bool:
    """R1-Zero in miniature's base model (tools/miniature/trace_model.py): both formats, a prior for the short
    one. Made from its settings and the held-out problems alone, so the task's training range (the
    control's 1..2 digits) shares it."""
    settings = TM.Settings.from_mapping(a.base_model or {})
    cfg = model_config(**{**a.model_overrides, "vocab_size": vocab})
    test = long_addition_split(a.task or {})[1]
    return _pretrained(
        a, TM, TM.wanted(settings, cfg, _digest([p.text for p in test])), "minutes",
        lambda tmp: TM.make(tmp, settings, cfg, test, log), log,
    )  # fmt: skip


def _pretrained(
    a: Assets, module: Any, stamp: dict[str, Any], takes: str, make: Callable[[Path], Any], log: Log
) -> bool:
    """A base model pre-trained here (`module`: base_model or trace_model): reused while its stamp matches
    (its result summarised), else made into a partial folder by `make` and published; True when made."""
    want = {"v": ASSETS_VERSION, **stamp}
    reason = _stale(a.hf_model, want)
    if reason is None:
        result = module.read_result(a.hf_model)
        if result:
            log(module.summary(result) + f" (cached: {a.hf_model})")
        return False
    _announce(a.hf_model, reason, f"the base model (pre-trained here, {takes})", log)
    with _partial(a.hf_model) as tmp:
        make(tmp)
        _publish(tmp, a.hf_model, want)
    return True


def long_addition_split(task: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """(training problems, held-out problems) of a long-addition `launch.task`: the held-out ones,
    `test` a bucket of 1..max_digits digits, are the base model's and the validation's; the training
    ones, `train` a bucket of train_min_digits..train_max_digits, never include a held-out one in either
    order (a + b or b + a)."""
    seed, top = int(task.get("seed", 0)), int(task.get("max_digits", 5))
    lo, hi = int(task.get("train_min_digits", 1)), int(task.get("train_max_digits", top))
    if not 1 <= lo <= hi <= top:
        raise UserError(
            f"launch.task.train_min_digits {lo} and train_max_digits {hi}",
            fix=f"digit counts with 1 <= train_min_digits <= train_max_digits <= max_digits ({top})",
        )
    test = T.problems(seed + 10_000, range(1, top + 1), int(task.get("test", 32)))
    # a held-out a + b is kept out in both orders: b + a is the same sum to learn
    train = T.problems(seed, range(lo, hi + 1), int(task.get("train", 2000)), exclude=T.both_orders(test))
    return train, test


def _write_long_addition(a: Assets, tmp: Path) -> None:
    """train.parquet / test.parquet in verl's schema, one data source a bucket (`addition-<n>d`), so that
    verl logs validation accuracy, trace rate and length per difficulty."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tools.data.schema import SCHEMA  # pyarrow: only when the long-addition data is written

    train, test = long_addition_split(a.task or {})
    random.Random(int((a.task or {}).get("seed", 0))).shuffle(
        train
    )  # verl shuffles too; a fixed order keeps the file itself deterministic
    for split, ps in (("train", train), ("test", test)):
        rows = [
            {
                "data_source": p.data_source,
                "prompt": p.messages(),
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": p.answer},
                "extra_info": {"split": split, "index": i, "source_row": i},
            }
            for i, p in enumerate(ps)
        ]
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp / f"{split}.parquet")
    with atomic.atomic_path(a.raw_data) as tmp_json:
        write_json([{"problem": p.text, "answer": p.answer} for p in train + test], tmp_json)


def make_data(a: Assets, log: Log = print) -> bool:
    """DeepScaleR-format JSON of problems with known answers -> the project's data tool -> parquet."""
    if a.task is not None and a.task.get("kind") == "long-addition":
        want = {"v": ASSETS_VERSION, "split": LONG_ADDITION_SPLIT, "task": dict(a.task)}
        reason = _stale(a.data, want)
        if reason is None:
            return False
        _announce(a.data, reason, "the long-addition problems (tools/tasks/long_addition.py)", log)
        a.raw_data.parent.mkdir(parents=True, exist_ok=True)
        with _partial(a.data) as tmp:
            _write_long_addition(a, tmp)
            _publish(tmp, a.data, want)
        return True
    if a.task is None:
        want: dict[str, Any] = {"v": ASSETS_VERSION, "n": N_PROBLEMS, "test": N_TEST, "seed": SEED}
        what = f"{N_PROBLEMS} DeepScaleR-format problems ({a.raw_data}), converted by tools.data"
        args = ["--test-size", str(N_TEST), "--seed", str(SEED), "--data-source", "tiny-deepscaler"]
    else:
        task = dict(a.task)
        kind = task.get("kind")
        if kind not in TASKS:
            raise UserError(f"launch.task.kind is {kind!r}", fix=f"one of {', '.join(TASKS)}")
        want = {"v": ASSETS_VERSION, "task": task}
        what = f"the {kind} problems ({a.raw_data}), converted by tools.data"
        args = [
            "--test-size", str(task["test"]), "--seed", str(task["seed"]), "--data-source", str(kind),
            "--template", str(task.get("template", "r1-zero")), "--style", str(task.get("style", "system")),
        ]  # fmt: skip
    reason = _stale(a.data, want)
    if reason is None and a.raw_data.exists():
        return False
    _announce(a.data, reason or "missing", what, log)
    a.raw_data.parent.mkdir(parents=True, exist_ok=True)
    if a.task is None:
        rows = deepscaler_rows(N_PROBLEMS, seed=SEED)
    else:
        rows = addition_rows(int(a.task["operand_max"]))
    with atomic.atomic_path(a.raw_data) as tmp_json:
        write_json(rows, tmp_json)
    with _partial(a.data, mkdir=False) as tmp:
        cmd = [sys.executable, "-m", "tools.data", "convert", str(a.raw_data), str(tmp), "--format",
               "deepscaler", *args, "--quiet"]  # fmt: skip
        _run(cmd, "python -m tools.data convert")
        _publish(tmp, a.data, want)
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
    want = {"v": ASSETS_VERSION, "model": _stamp_digest(a.hf_model), "spec": spec}
    reason = _stale(a.mcore, want)
    if reason is None:
        return False
    _announce(
        a.mcore, reason, f"the Megatron checkpoint of {a.hf_model} (hf-to-mcore, {spec} layer spec)", log
    )
    with _partial(a.mcore, mkdir=False) as tmp:
        cmd = [sys.executable, "-m", "tools.weights", "hf-to-mcore", str(a.hf_model), str(tmp), "--threads",
               "1", "--layer-spec", spec]  # fmt: skip
        _run(cmd, "python -m tools.weights hf-to-mcore")
        _publish(tmp, a.mcore, want)
    return True


def _run(cmd: list[str], what: str) -> None:
    """`cmd` in a session of its own, its output kept for the error; when this process is stopped (Ctrl-C,
    SIGTERM as `errors.Stopped`), the command and whatever it started are frozen and killed before any of
    them writes another file."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate()
    except BaseException:
        from tools.launch.process_tree import ProcessTree  # psutil: only when something must be stopped

        ProcessTree(proc.pid).kill_now()
        proc.wait()
        raise
    if proc.returncode != 0:
        raise UserError(
            f"{what} failed (exit {proc.returncode}):\n{stdout[-2000:]}{stderr[-2000:]}",
            fix="run the command above by hand to see the whole output",
        )


def ensure(a: Assets, *, mcore: bool = False, log: Log = print) -> Assets:
    """Make whatever is missing or stale; cheap when everything is cached."""
    make_data(a, log)  # first: a pre-trained base model is made from the data
    make_model(a, log)
    if mcore:
        make_mcore(a, log)
    return a


def recipe_from_argv(
    prog: str, description: str | None, default: str, argv: list[str] | None
) -> tuple[str, DictConfig]:
    """`python -m <prog> [recipe] [overrides...]` (argparse, `default` when no recipe is named): the
    recipe's name and the recipe composed with its Hydra overrides."""
    import argparse

    from tools.recipes.recipe import compose  # Hydra: only the command line composes a recipe here

    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("recipe", nargs="?", default=default)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the recipe")
    a = ap.parse_args(argv)
    return a.recipe, compose(a.recipe, a.overrides)


def main(argv: list[str] | None = None) -> int:
    from omegaconf import OmegaConf

    _, cfg = recipe_from_argv("python -m tools.miniature.assets", __doc__, "tiny-cpu", argv)
    mcore = bool(OmegaConf.select(cfg, "verl.actor_rollout_ref.actor.megatron.use_dist_checkpointing"))
    ensure(Assets.from_launch(cfg.launch), mcore=mcore)
    return 0


if __name__ == "__main__":
    run_cli(main)
