"""Batch rules: mini | global; (mini x n) / DP per rank, divisible by the micro-batch; log-prob
micro-batches; prompts per rollout engine; max_num_seqs; max_num_batched_tokens >= max_model_len; Megatron
seq_length >= prompt + response (warning); on-policy = 1 epoch and 1 mini-batch; launch.steps and the
steps the data feeds.

Also the public helpers `make train` uses before it starts (data_batches, steps_fix, train_command,
launch_steps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools import stacks
from tools.errors import UserError
from tools.plan.context import INFO, Context, check_integer

G = "batch"
ARR = "actor_rollout_ref."


def check(ctx: Context) -> None:
    g = ctx.get
    B = ctx.integer(G, "data.train_batch_size")
    n = ctx.integer(G, ARR + "rollout.n", default=1)
    mini = ctx.integer(G, ARR + "actor.ppo_mini_batch_size")
    micro = ctx.integer(G, ARR + "actor.ppo_micro_batch_size_per_gpu", if_null=0) or None
    epochs = ctx.integer(G, ARR + "actor.ppo_epochs", default=1)
    steps_value(ctx)
    lengths(ctx)
    if None in (B, n, mini, epochs):
        ctx.skip(G, "batch rules", "fix the values above first")
        return
    dp = ctx.layout.dp if ctx.layout and ctx.launch.backend == "megatron" else ctx.world
    ctx.add(
        G,
        "mini-batch divides the batch",
        B % mini == 0,
        f"{B} prompts / mini {mini}",
        "data.train_batch_size must be a multiple of actor.ppo_mini_batch_size",
    )
    if ctx.layout is None or not dp or dp < 1:  # the actor layout does not fit: layout rules say so
        ctx.skip(G, "per-rank batch rules", "the actor layout does not fit the world (see layout)")
    else:
        per_rank_rules(ctx, B, n, mini, micro, dp)
    if ctx.world and ctx.rollout_tp:
        engine_rules(ctx, B, n)
    if ctx.seq is not None and g(ARR + "rollout.name") == "vllm":
        token_budget_rule(ctx)
    if ctx.seq is not None and ctx.launch.backend == "megatron":
        otc = g(ARR + "actor.megatron.override_transformer_config", {}) or {}
        sl = otc.get("seq_length") if isinstance(otc, dict) else None
        if sl is not None:
            P, Rl = ctx.prompt, ctx.response
            whole = check_integer(sl, low=1) == sl
            ctx.add(
                G,
                "Megatron seq_length >= prompt + response",
                whole and sl >= P + Rl,
                f"seq_length {sl!r}, prompt {P} + response {Rl} = {P + Rl}",
                "known quirk of the published run: verl packs sequences itself, so MindSpeed's "
                f"seq_length only sizes buffers; set it to {P + Rl} unless you reproduce the run"
                if whole
                else f"set override_transformer_config.seq_length to a whole number >= {P + Rl}",
                warn=whole,
            )
    on_policy_rule(ctx, B, mini, epochs)


def steps_value(ctx: Context) -> None:
    steps = ctx.launch.get("steps")
    if steps is not None:  # null (grpo-r1-zero's): not set, a run names it (make train refuses it unset)
        ctx.integer(G, "steps", launch=True, why="the steps `make train` trains")
    ctx.integer(G, "trainer.total_epochs")
    total = ctx.get("trainer.total_training_steps")
    if total is not None and total != steps:  # the recipes set it to ${launch.steps}: one FAIL is enough
        ctx.integer(G, "trainer.total_training_steps")


def lengths(ctx: Context) -> None:
    P = ctx.integer(G, "data.max_prompt_length")
    Rl = ctx.integer(G, "data.max_response_length")
    mml = ctx.integer(G, ARR + "rollout.max_model_len", if_null=0)
    if None in (P, Rl, mml):
        return
    ctx.prompt, ctx.response = P, Rl
    ctx.seq, ctx.max_model_len = P + Rl, mml or P + Rl


def per_rank_rules(ctx: Context, B: int, n: int, mini: int, micro: int | None, dp: int) -> None:
    per_rank = mini * n / dp
    ok = per_rank == int(per_rank) and per_rank > 0
    ctx.add(
        G,
        "mini-batch x n divides over DP",
        ok,
        f"{mini} x {n} / DP{dp} = {per_rank:g} a rank",
        f"ppo_mini_batch_size x rollout.n must be a multiple of the actor's DP size {dp}",
    )
    if ok and micro:
        ctx.add(
            G,
            "micro-batch divides the rank's mini-batch",
            int(per_rank) % micro == 0,
            f"{int(per_rank)} / micro {micro}"
            + (f" = {int(per_rank) // micro} micro-batches" if int(per_rank) % micro == 0 else ""),
            "ppo_micro_batch_size_per_gpu must divide (mini x n / DP)",
        )
    total = B * n
    for who in ("rollout", "ref"):
        lp = ctx.integer(G, f"{ARR}{who}.log_prob_micro_batch_size_per_gpu", if_null=0)
        if lp:
            per = total / dp
            ctx.add(
                G,
                f"{who} log-prob micro-batch divides",
                per == int(per) and int(per) % lp == 0,
                f"{B} x {n} / DP{dp} = {per:g} a rank, micro {lp}",
                f"actor_rollout_ref.{who}.log_prob_micro_batch_size_per_gpu must divide (batch x n / DP)",
            )


def engine_rules(ctx: Context, B: int, n: int) -> None:
    rdp = ctx.world // ctx.rollout_tp if ctx.world % ctx.rollout_tp == 0 else None
    if not rdp:
        return
    ctx.add(
        G,
        "prompts split over rollout engines",
        B % rdp == 0,
        f"{B} prompts / {rdp} engines" + (f" = {B // rdp} each" if B % rdp == 0 else ""),
        f"data.train_batch_size must be a multiple of world / rollout TP = {rdp}",
    )
    if ctx.get(ARR + "rollout.name") != "vllm":
        return
    mns = ctx.integer(G, ARR + "rollout.max_num_seqs")
    if mns is None or B % rdp:
        return
    seqs = B // rdp * n
    res = ctx.add(
        G,
        "max_num_seqs covers an engine's sequences",
        mns >= seqs,
        f"max_num_seqs {mns}, {B // rdp} prompts x {n} = {seqs} a engine",
        f"generation runs in {-(-seqs // mns)} waves: raise max_num_seqs to {seqs} "
        "(costs KV cache) or accept the slower generation",
        warn=True,
    )
    if mns > seqs:
        res.message = f"{mns - seqs} slots never used: {seqs} is enough (graph batch size too)"
        res.status = INFO


def token_budget_rule(ctx: Context) -> None:
    mbt = ctx.integer(G, ARR + "rollout.max_num_batched_tokens")
    if mbt is None:
        return
    mml, P, Rl = ctx.max_model_len, ctx.prompt, ctx.response
    chunked = bool(ctx.get(ARR + "rollout.enable_chunked_prefill"))
    values = (
        f"max_num_batched_tokens {mbt}, max_model_len {mml} (prompt {P} + response {Rl}), "
        f"chunked prefill {'on' if chunked else 'off'}"
    )
    if ctx.launch.get("rollout_mode") == "server":
        # verl 0.9.1 raises the budget to max_model_len itself when chunked prefill is off
        # (vllm_async_server.py _validate_configs); with it on, a smaller budget splits prefills
        ctx.add(
            G,
            "max_num_batched_tokens >= max_model_len",
            mbt >= mml or chunked,
            values,
            "with chunked prefill off a prompt longer than one batch cannot be scheduled",
            info="one prefill batch holds a whole sequence"
            if mbt >= mml
            else "chunked prefill splits longer prompts",
        )
    else:
        ctx.add(
            G,
            "max_num_batched_tokens >= max_model_len",
            mbt >= mml,
            values,
            f"set rollout.max_num_batched_tokens >= {mml}: with chunked prefill on, verl 0.6.0 raises "
            "(vllm_rollout_spmd.py: 'max_num_batched_tokens is smaller than max_model_len'); with it "
            "off, vLLM and vllm-ascend's ascend scheduler refuse a prompt longer than one batch",
            info="one prefill batch holds a whole sequence",
        )


def on_policy_rule(ctx: Context, B: int, mini: int, epochs: int) -> None:
    single = epochs == 1 and mini == B
    values = f"ppo_epochs {epochs}, {B // mini if B % mini == 0 else '?'} mini-batch(es) a step"
    if bool(ctx.launch.get("on_policy", False)):
        ctx.add(
            G,
            "on-policy (single mini-batch)",
            single,
            values,
            "launch.on_policy needs ppo_epochs=1 and ppo_mini_batch_size = train_batch_size: only "
            "then the old log-probs equal the current ones (docs/design.md §4)",
            info="old log-prob = current log-prob, importance ratio exactly 1",
        )
    else:
        ctx.note(
            G,
            "on-policy (single mini-batch)",
            values,
            "on-policy path active" if single else "off-policy: stored old log-probs are used",
        )


def steps_rule(ctx: Context, train_files: Any) -> None:
    """More steps asked than the data has batches for: verl would end early without a word."""
    raw = (
        ctx.get("trainer.total_training_steps"),
        ctx.get("data.gen_batch_size") or ctx.get("data.train_batch_size"),
        ctx.get("trainer.total_epochs") or 1,
    )
    asked, batch, epochs = (check_integer(x, low=1) for x in raw)
    if not all(isinstance(x, int) for x in (asked, batch, epochs)):
        return  # unset, or refused by the value rules
    b = data_batches(train_files, batch, epochs)
    ctx.add(
        G,
        "steps <= batches in the data",
        asked <= b.total,
        f"{asked} steps; {b.describe()}",
        steps_fix(ctx.launch.recipe, ctx.launch.stack, ctx.launch.get("overrides") or [], asked, b),
    )


def launch_steps(cfg: Any) -> int:
    """launch.steps as `make train` uses it: a whole number >= 1, else a UserError naming the key."""
    raw = cfg.launch.get("steps")
    value = check_integer(raw, low=1)
    if not isinstance(value, int):
        raise UserError(
            f"launch.steps={raw!r}: the steps to train must be a whole number >= 1",
            fix=f"pass them, e.g. make train RECIPE={cfg.launch.get('recipe', '<recipe>')} ARGS='launch.steps=5'",
        )
    return value


@dataclass(frozen=True)
class Batches:
    rows: int  # training rows
    batch: int  # prompts a step
    epochs: int

    @property
    def per_epoch(self) -> int:  # verl's train dataloader drops the last partial batch
        return self.rows // self.batch

    @property
    def total(self) -> int:
        return self.per_epoch * self.epochs

    def describe(self) -> str:
        return (
            f"the data has {self.rows} training rows // {self.batch} prompts a step = {self.per_epoch} batches "
            f"an epoch x {self.epochs} epochs = {self.total} batches"
        )


def data_batches(train_files: Any, batch: int, epochs: int) -> Batches:
    """How many training steps the data feeds (rows of every train file, verl's drop-last batches)."""
    from tools.data.parquet import open_parquet  # pyarrow: only when the data is read

    files = train_files if isinstance(train_files, list | tuple) else [train_files]
    rows = sum(open_parquet(str(f)).metadata.num_rows for f in files)
    return Batches(rows, batch, epochs)


def train_command(recipe: str, stack: str, args: str = "") -> str:
    """`make train` for `recipe` on `stack`, naming the stack when it is not the default (the command must
    run as printed)."""

    named = "" if stack == stacks.default().name else f" STACK={stack}"
    return f"make train{named} RECIPE={recipe}" + (f" ARGS='{args}'" if args else "")


def steps_fix(recipe: str, stack: str, overrides: list[str], asked: int, b: Batches) -> str:
    """The command that gives `asked` steps enough data: more epochs (or fewer steps)."""
    need = -(-asked // max(1, b.per_epoch)) if b.per_epoch else None
    keep = [
        o for o in overrides if not o.split("=", 1)[0].lstrip("+").startswith("verl.trainer.total_epochs")
    ]
    if need is None:
        return f"the data has fewer rows ({b.rows}) than one batch ({b.batch}): more data or a smaller batch"
    args = " ".join([*keep, f"verl.trainer.total_epochs={need}"])
    return (
        f"verl would stop after {b.total} steps: {train_command(recipe, stack, args)} "
        f"(or ask for at most {b.total} steps)"
    )
