"""R1-Zero's mechanism, read from a run of recipes/tiny-zero.yaml: did the model learn to reason longer
because reasoning pays?

What a run records and where this reads it:
    metrics.jsonl             per training step: response_length/mean and /clip_ratio, actor/entropy,
                              actor/kl_loss, actor/pg_clipfrac, actor/grad_norm (verl), reward/trace (the
                              share of the step's responses that wrote the trace: tools/reward/tally.py);
                              per validation: val-core/addition-<n>d/acc/mean@N and
                              val-aux/addition-<n>d/trace/mean@N for every bucket n
    validation/<step>.jsonl   every validation response (verl's validation_data_dir): its length in tokens,
                              whether it was right, and a few responses to one held-out problem to show
    base_model.json           the base model before RL (tools/miniature/trace_model.py): greedy and sampled
    final_eval.json           the trained actor exported and scored the same way

`figures` turns a run into the numbers the issue of this recipe asks for, `checks` compares them with
their bounds (main run, or a control), and `draw` / `section` make the report's figure and page section
(several runs overlaid). bench/bench_zero.py and tests/test_zero.py use the same functions.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.records import is_accuracy, validation_key
from tools.reward import tally
from tools.tasks import long_addition as T

FIRST, LAST = 5, 10  # response length: the first 5 steps against the last 10
# the no-pay control's reward (tools/reward/verl_reward.py): any closed answer scores 1
BLIND_REWARD = "compute_score_long_addition_blind"


@dataclass
class Picture:
    label: str
    length: dict[int, float] = field(default_factory=dict)  # training step -> response_length/mean
    clip: dict[int, float] = field(default_factory=dict)
    trace: dict[int, float] = field(default_factory=dict)  # training step -> reward/trace
    # training step -> accuracy of the responses that wrote the trace / of those that did not (the edge)
    acc_trace: dict[int, float] = field(default_factory=dict)
    acc_direct: dict[int, float] = field(default_factory=dict)
    health: dict[str, dict[int, float]] = field(default_factory=dict)  # actor/* -> step -> value
    acc: dict[int, dict[int, float]] = field(default_factory=dict)  # bucket -> validation step -> sampled acc
    val_trace: dict[int, dict[int, float]] = field(default_factory=dict)  # bucket -> step -> trace rate
    val_length: dict[int, float] = field(default_factory=dict)  # validation step -> mean response tokens
    # validation step -> share of the held-out responses that open with the trace tag / that write a valid
    # trace for their problem (long_addition.valid_trace), from validation/<step>.jsonl (prompts beside them)
    val_tag: dict[int, float] = field(default_factory=dict)
    val_valid: dict[int, float] = field(default_factory=dict)
    lengths_by_outcome: dict[str, float] = field(default_factory=dict)  # last validation: right / wrong
    examples: dict[int, tuple[str, list[str]]] = field(default_factory=dict)  # step -> (problem, responses)
    base: dict[str, Any] | None = None
    final: dict[str, Any] | None = None

    @property
    def buckets(self) -> list[int]:
        return sorted(self.acc)

    @property
    def val_steps(self) -> list[int]:
        return sorted({s for b in self.acc.values() for s in b})

    def mean_acc(self, step: int) -> float:
        return _mean([self.acc[b][step] for b in self.buckets if step in self.acc[b]])


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not math.isnan(float(v)) else None


def _tokenizer(cfg: Any) -> Any:
    from omegaconf import OmegaConf

    path = OmegaConf.select(cfg, "launch.paths.hf_model") if cfg is not None else None
    if not path or not (Path(path) / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))


def read_generations(folder: Path, tok: Any) -> dict[int, list[dict[str, Any]]]:
    """validation/<step>.jsonl: step -> records with the response's `tokens` (its length) added."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((folder / "validation").glob("*.jsonl")):
        if not path.stem.isdigit():
            continue
        rows = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            text = rec.get("output") or ""
            # the decoded response has no end-of-sequence token: +1 where the answer closed (it stopped)
            rec["tokens"] = (len(tok.encode(text).ids) if tok else len(text)) + (1 if T.closed(text) else 0)
            rows.append(rec)
        out[int(path.stem)] = rows
    return out


def picture(run: Any) -> Picture | None:
    """What `run` (tools/report/runs.Run) shows; None for a run of another task."""
    p = Picture(run.label)
    for step, m in run.validations.items():
        for key, value in m.items():
            hit = validation_key(key) if is_accuracy(key) else None
            n = T.digits_of_source(hit.source) if hit else None
            if n is not None and _number(value) is not None:
                source, k = hit.source, hit.n
                p.acc.setdefault(n, {})[step] = float(value)
                trace = _number(m.get(f"val-aux/{source}/trace/mean@{k}"))
                if trace is not None:
                    p.val_trace.setdefault(n, {})[step] = trace
    if not p.acc:
        return None
    for step, m in run.steps.items():
        for key, into in (
            ("response_length/mean", p.length),
            ("response_length/clip_ratio", p.clip),
            ("reward/trace", p.trace),
            (tally.split_keys("trace")[0], p.acc_trace),
            (tally.split_keys("trace")[1], p.acc_direct),
        ):
            if _number(m.get(key)) is not None:
                into[step] = float(m[key])
        for key in ("actor/entropy", "actor/kl_loss", "actor/pg_clipfrac", "actor/grad_norm"):
            if key in m and isinstance(m[key], int | float):
                p.health.setdefault(key, {})[step] = float(m[key])  # NaN kept: a check looks for it
    gens = read_generations(run.folder, _tokenizer(run.config)) if run.folder.is_dir() else {}
    for step, rows in gens.items():
        p.val_length[step] = _mean([r["tokens"] for r in rows])
        outputs = [(str(r.get("output") or ""), _parsed(_problem(r))) for r in rows]
        outputs = [(text, q) for text, q in outputs if q is not None]
        if outputs:
            p.val_tag[step] = _mean([float(T.uses_trace(text)) for text, _ in outputs])
            p.val_valid[step] = _mean([float(T.valid_trace(text, q)) for text, q in outputs])
    if gens:
        last = gens[max(gens)]
        for outcome, right in (("right", True), ("wrong", False)):
            p.lengths_by_outcome[outcome] = _mean([r["tokens"] for r in last if bool(r.get("acc")) == right])
        p.lengths_by_outcome["right_minus_wrong"] = _right_minus_wrong(last)
        steps = sorted(gens)
        shown = [steps[0], steps[len(steps) // 2], steps[-1]]
        problem = _hardest_problem(gens[steps[0]])
        for step in dict.fromkeys(shown):
            p.examples[step] = (problem, [r.get("output", "") for r in gens[step] if _problem(r) == problem])
    for name, attr in (("base_model.json", "base"), ("final_eval.json", "final")):
        with contextlib.suppress(OSError, ValueError):
            setattr(p, attr, json.loads((run.folder / name).read_text()))
    return p


def _right_minus_wrong(rows: list[dict[str, Any]]) -> float:
    """Mean length of right minus wrong answers within each digit count, weighted by its wrong answers: pooled
    over the buckets, wrong answers come mostly from the hardest, whose responses are the longest, so the pooled
    difference measures difficulty, not GRPO's length bias. NaN when no bucket has both."""
    by: dict[int, dict[bool, list[int]]] = {}
    for r in rows:
        try:
            n = T.parse_problem(_problem(r)).digits
        except ValueError:
            continue
        by.setdefault(n, {True: [], False: []})[bool(r.get("acc"))].append(r["tokens"])
    pairs = [(len(v[False]), _mean(v[True]) - _mean(v[False])) for v in by.values() if v[True] and v[False]]
    weight = sum(w for w, _ in pairs)
    return sum(w * d for w, d in pairs) / weight if weight else math.nan


def _problem(rec: dict[str, Any]) -> str:
    return str(rec.get("input", "")).strip()


def _parsed(text: str) -> T.Problem | None:
    try:
        return T.parse_problem(text)
    except ValueError:
        return None


def _hardest_problem(rows: list[dict[str, Any]]) -> str:
    """The first problem of the longest operands among the validation's."""

    def digits(text: str) -> int:
        try:
            return T.parse_problem(text).digits
        except ValueError:
            return 0

    return max((_problem(r) for r in rows), key=lambda t: (digits(t), -len(t)), default="")


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN for fewer than 3 points or no spread."""

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(xs) < 3:
        return math.nan
    rx, ry = ranks(xs), ranks(ys)
    mx, my = _mean(rx), _mean(ry)
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    if sx == 0 or sy == 0:
        return math.nan
    return sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True)) / (sx * sy)


def window(series: dict[int, float], first: bool, n: int) -> float:
    """The mean of a per-step series over its first (or last) n steps."""
    steps = sorted(series)
    return _mean([series[s] for s in (steps[:n] if first else steps[-n:])])


def _per_bucket(record: dict[str, Any] | None, part: str) -> dict[int, float]:
    held = (record or {}).get("held_out", record or {})
    return {int(k): float(v["acc"]) for k, v in (held.get(part) or {}).items()}


def figures(p: Picture) -> dict[str, Any]:
    """The numbers: length growth, accuracy rise on the two hardest buckets (sampled: first and last
    validation; greedy: base model and trained actor), trace rate, the length-accuracy rank correlation over
    the validation points, truncation, the actor's health, and the length of right against wrong answers."""
    hard = p.buckets[-2:]
    v0, v1 = (p.val_steps[0], p.val_steps[-1]) if p.val_steps else (None, None)
    greedy0, greedy1 = _per_bucket(p.base, "greedy"), _per_bucket(p.final, "greedy")
    points = [s for s in p.val_steps if s in p.val_length]
    h = p.health
    first = _first_accuracies(p)  # the trace's edge the length can grow from
    return {
        "steps": len(p.length),
        "length_first5": window(p.length, True, FIRST),
        "length_last10": window(p.length, False, LAST),
        "length_ratio": window(p.length, False, LAST) / window(p.length, True, FIRST)
        if p.length
        else math.nan,
        "hard_buckets": hard,
        "sampled_hard_first": _mean([p.acc[b][v0] for b in hard]) if v0 is not None else math.nan,
        "sampled_hard_last": _mean([p.acc[b][v1] for b in hard]) if v1 is not None else math.nan,
        "greedy_hard_before": _mean([greedy0[b] for b in hard if b in greedy0]),
        "greedy_hard_after": _mean([greedy1[b] for b in hard if b in greedy1]),
        "trace_first5": window(p.trace, True, FIRST) if p.trace else math.nan,
        "edge_first5": first[0] - first[1] if first else math.nan,
        "trace_last10": window(p.trace, False, LAST) if p.trace else math.nan,
        "val_trace_last": _mean([p.val_trace[b][v1] for b in p.val_trace if v1 in p.val_trace[b]]),
        # the held-out responses of the last validation: the trace tag against a valid trace (reported, not
        # checked: the checks read the tag rate, reward/trace)
        "val_tag_last": p.val_tag[max(p.val_tag)] if p.val_tag else math.nan,
        "val_valid_trace_last": p.val_valid[max(p.val_valid)] if p.val_valid else math.nan,
        "spearman_length_accuracy": spearman(
            [p.val_length[s] for s in points], [p.mean_acc(s) for s in points]
        ),
        "validation_points": len(points),
        "clip_ratio_max": max(p.clip.values(), default=math.nan),
        "entropy_min": min(h.get("actor/entropy", {}).values(), default=math.nan),
        "kl_loss_max": max(h.get("actor/kl_loss", {}).values(), default=math.nan),
        "pg_clipfrac_max": max(h.get("actor/pg_clipfrac", {}).values(), default=math.nan),
        "grad_norm_max": max(h.get("actor/grad_norm", {}).values(), default=math.nan),
        "right_length": p.lengths_by_outcome.get("right", math.nan),
        "wrong_length": p.lengths_by_outcome.get("wrong", math.nan),
        "right_minus_wrong_by_digits": p.lengths_by_outcome.get("right_minus_wrong", math.nan),
    }


@dataclass(frozen=True)
class Check:
    name: str
    value: float
    bound: str
    met: bool

    def line(self) -> str:
        shown = "n/a" if isinstance(self.value, float) and math.isnan(self.value) else f"{self.value:.3g}"
        return f"{'ok  ' if self.met else 'MISS'} {self.name}: {shown} (want {self.bound})"


def _check(name: str, value: float, op: str, bound: float) -> Check:
    ok = (
        not math.isnan(value)
        and {">=": value >= bound, "<=": value <= bound, ">": value > bound, "<": value < bound}[op]
    )
    return Check(name, value, f"{op} {bound:g}", ok)


def checks(f: dict[str, Any], kind: str = "main") -> list[Check]:
    """The figures against their bounds. `main` (and `dr-grpo`): length x1.5, the hard buckets' accuracy
    +0.3 greedy and sampled, trace rate 0.7, rank correlation 0.8, no truncation, a healthy actor, right
    answers at least as long as wrong ones. `no-edge` (the control whose trace gives no edge): the length
    does not grow (x1.15 at most), and no truncation. `no-pay` (the control whose reward is blind to the sum):
    that, and the trace rate does not rise (+0.1 at most)."""
    out = [_check("response_length/clip_ratio, every step", f["clip_ratio_max"], "<=", 0.05)]
    if kind in ("no-edge", "no-pay"):
        out.append(_check("mean response length, last 10 / first 5 steps", f["length_ratio"], "<=", 1.15))
        if kind == "no-pay":
            rise = f["trace_last10"] - f["trace_first5"]
            out.append(_check("trace rate, last 10 - first 5 steps", rise, "<=", 0.1))
        return out
    # the KL loss is logged only where the run has one (the Dr. GRPO control has none)
    kl = kind != "dr-grpo"
    keys = ("entropy_min", "grad_norm_max", *(("kl_loss_max",) if kl else ()))
    finite = all(not math.isnan(f[k]) and math.isfinite(f[k]) for k in keys)
    return [
        *out,
        _check("mean response length, last 10 / first 5 steps", f["length_ratio"], ">=", 1.5),
        _check("sampled accuracy, two hardest buckets, last - first validation",
               f["sampled_hard_last"] - f["sampled_hard_first"], ">=", 0.3),
        _check("greedy accuracy, two hardest buckets, trained - base",
               f["greedy_hard_after"] - f["greedy_hard_before"], ">=", 0.3),
        _check("trace rate, last 10 steps", f["trace_last10"], ">=", 0.7),
        _check("Spearman(length, accuracy) over the validation points", f["spearman_length_accuracy"], ">=", 0.8),
        _check("actor/entropy (min)", f["entropy_min"], ">", 0.0),
        *([_check("actor/kl_loss (max)", f["kl_loss_max"], "<=", 1.0)] if kl else []),
        _check("actor/pg_clipfrac (max)", f["pg_clipfrac_max"], "<", 0.2),
        Check(f"{', '.join(k.rsplit('_', 1)[0] for k in keys)} finite", float(finite), "== 1", finite),
        _outcome_lengths(f),
    ]  # fmt: skip


def _outcome_lengths(f: dict[str, Any]) -> Check:
    """Right answers at least as long as wrong ones of the same digit count (GRPO's length bias grows wrong
    answers); met at once when no bucket of the last validation had a wrong answer."""
    name = "right - wrong answer length within a digit count, last validation (tokens)"
    if math.isnan(f["right_minus_wrong_by_digits"]) and not math.isnan(f["right_length"]):
        return Check(name + ": no bucket with a wrong answer", f["right_length"], ">= 0", True)
    return _check(name, f["right_minus_wrong_by_digits"], ">=", 0.0)


COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def draw(pictures: Sequence[Picture]) -> bytes:
    """One PNG, every run overlaid: accuracy and mean response length on two axes; the trace rate; the
    sampled accuracy of each bucket over the validation points."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.8))
    ax_acc, ax_trace, ax_bucket = fig.subplots(1, 3)
    ax_len = ax_acc.twinx()
    for i, p in enumerate(pictures):
        c = COLORS[i % len(COLORS)]
        tag = f"{p.label}: " if len(pictures) > 1 else ""
        vs = p.val_steps
        ax_acc.plot(vs, [p.mean_acc(s) for s in vs], "o-", color=c, label=f"{tag}held-out accuracy (sampled)")
        xs = sorted(p.length)
        ax_len.plot(
            xs, [p.length[s] for s in xs], "--", color=c, alpha=0.6, label=f"{tag}mean response length"
        )
        if p.trace:
            xs = sorted(p.trace)
            ax_trace.plot(xs, [p.trace[s] for s in xs], color=c, label=f"{tag}training responses")
        vt = [s for s in vs if all(s in p.val_trace.get(b, {}) for b in p.buckets)]
        if vt:
            ax_trace.plot(vt, [_mean([p.val_trace[b][s] for b in p.buckets]) for s in vt], "o", color=c,
                          label=f"{tag}held-out")  # fmt: skip
        for j, b in enumerate(p.buckets):
            shade = 0.35 + 0.65 * (j + 1) / len(p.buckets)
            steps = sorted(p.acc[b])
            ax_bucket.plot(steps, [p.acc[b][s] for s in steps], "o-", color=c, alpha=shade,
                           label=f"{tag}{b} digits")  # fmt: skip
    ax_acc.set(xlabel="GRPO step", ylabel="held-out accuracy", ylim=(0, 1.02), title="accuracy and length")
    ax_len.set_ylabel("mean response length (tokens)")
    ax_trace.set(
        xlabel="GRPO step", ylabel="share of responses with the trace", ylim=(0, 1.02), title="trace rate"
    )
    ax_bucket.set(
        xlabel="GRPO step", ylabel="held-out accuracy (sampled)", ylim=(0, 1.02), title="accuracy by digits"
    )
    lines = ax_acc.get_legend_handles_labels()
    more = ax_len.get_legend_handles_labels()
    ax_acc.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower right")
    for ax in (ax_trace, ax_bucket):
        ax.legend(fontsize=7, loc="lower right")
    for ax in (ax_acc, ax_trace, ax_bucket):
        ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.05, right=0.98, top=0.9, bottom=0.14, wspace=0.45)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def kind_of(cfg: Any) -> str:
    """Which bounds a run answers to: `no-pay` when its reward is blind to the sum (launch.reward
    compute_score_long_addition_blind), `no-edge` when its training problems stop short of the hard buckets
    (launch.task.train_max_digits <= 2 of 3 or more: the trace gives no accuracy edge), `dr-grpo` without a KL
    loss (the Dr. GRPO control: its KL is not logged), else `main`."""
    from omegaconf import OmegaConf

    if OmegaConf.select(cfg, "launch.reward", default="") == BLIND_REWARD:
        return "no-pay"
    top = OmegaConf.select(cfg, "launch.task.train_max_digits", default=None)
    if top is not None and int(top) <= 2 and OmegaConf.select(cfg, "launch.task.max_digits", default=3) > 2:
        return "no-edge"
    kl = OmegaConf.select(cfg, "verl.actor_rollout_ref.actor.use_kl_loss", default=True)
    return "main" if kl else "dr-grpo"


def _first_accuracies(p: Picture) -> tuple[float, float] | None:
    """The training accuracy of the traced and of the direct responses over the first steps; None when a
    format never appeared."""
    if not p.acc_trace or not p.acc_direct:
        return None
    return window(p.acc_trace, True, FIRST), window(p.acc_direct, True, FIRST)


def edge_line(p: Picture) -> str | None:
    """Does the trace pay at the start? The training accuracy of the responses that wrote it against that of
    the direct ones over the first steps: the edge the length grows from (a control with no edge should show
    about 0 here, and a run whose length grew without one was drifting)."""
    first = _first_accuracies(p)
    if first is None:
        return None
    t, d = first
    return (
        f"the trace's edge, first {FIRST} training steps: responses with the trace right {t:.3f}, without "
        f"{d:.3f} ({t - d:+.3f})"
    )


def describe(p: Picture, kind: str = "main") -> list[str]:
    """Terminal lines: the figures, the trace's edge and each check."""
    f = figures(p)
    lines = [
        f"reasoning: mean response length {f['length_first5']:.1f} -> {f['length_last10']:.1f} tokens "
        f"(x{f['length_ratio']:.2f}, first {FIRST} vs last {LAST} steps); trace rate {f['trace_first5']:.2f} -> "
        f"{f['trace_last10']:.2f}; buckets {f['hard_buckets']} sampled {f['sampled_hard_first']:.2f} -> "
        f"{f['sampled_hard_last']:.2f}, greedy {f['greedy_hard_before']:.2f} -> {f['greedy_hard_after']:.2f}"
    ]
    edge, valid = edge_line(p), validity_line(p)
    return (lines + (["  " + edge] if edge else []) + (["  " + valid] if valid else [])
            + ["  " + c.line() for c in checks(f, kind)])  # fmt: skip


def validity_line(p: Picture) -> str | None:
    """The trace tag against the trace: of the last validation's held-out responses, the share that open
    with <think> and the share whose trace is right column by column for their problem. The checks read the
    tag rate (reward/trace); this says how much of it is a trace."""
    if not p.val_valid:
        return None
    step = max(p.val_valid)
    return (
        f"held-out responses at step {step}: trace tag {p.val_tag[step]:.3f}, valid trace "
        f"{p.val_valid[step]:.3f} (every column right for the problem; the checks read the tag rate)"
    )
