"""The report of one run or of several overlaid: which plots, captions and notes go on the page."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.analysis import learning, reasoning
from tools.report import health, mismatch, overlap, paper, plots, summary
from tools.report import page as P
from tools.report.runs import Run, get
from tools.report.table import SPLIT, row_from_metrics
from tools.report.terminal import flat_reward, validation_line

LEARN_KEY = "critic/rewards/mean"


@dataclass
class Built:
    title: str
    html: str
    images: dict[str, bytes] = field(default_factory=dict)
    rows: list[list[dict[str, Any]]] = field(default_factory=list)  # per run


def rows_of(run: Run) -> list[dict[str, Any]]:
    return [row_from_metrics(s, m, run.dev) for s, m in run.steps.items()]


def _series(runs: list[Run], keys: list[tuple[str, str]]) -> list[tuple[int, int, plots.Series]]:
    """(run index, metric index, (label, steps, values)) for each run and each key it logged."""
    out = []
    for ri, run in enumerate(runs):
        for mi, (key, label) in enumerate(keys):
            xs, ys = health.series_of(run, key)
            if any(y is not None for y in ys):
                out.append((ri, mi, (f"{run.label}: {label}" if len(runs) > 1 else label, xs, ys)))
    return out


# ---- sections ----


def what_ran(runs: list[Run], out: Path) -> str:
    per_run = [summary.items(r) for r in runs]
    names: list[str] = []
    for its in per_run:
        names += [i.name for i in its if i.name not in names]
    rows = []
    for name in names:
        vals = []
        for its in per_run:
            item = next((i for i in its if i.name == name), None)
            if item is None:
                vals.append("-")
            elif item.link:
                rel = os.path.relpath(item.value, out)
                vals.append(f'<a href="{P.esc(rel)}">{P.esc(item.link)}</a>')
            else:
                vals.append(P.esc(item.value))
        rows.append((name, vals))
    return P.section("summary", "What ran", P.kv_table([r.label for r in runs], rows))


def learning_table(c: Any) -> str:
    """Validation accuracy per step (and the base model's) as a table, with the curve in words."""
    if c is None or not c.accuracy:
        return ""

    s = c.summary()
    heads = [str(k) for k in sorted(c.accuracy)]
    vals = [f"{v:.3f}" for _, v in sorted(c.accuracy.items())]
    if s["base_sampled_acc"] is not None:
        heads, vals = ["base model", *heads], [f"{s['base_sampled_acc']:.3f}", *vals]
    return (
        f"<p>{P.esc(learning.describe(c))}. Validation accuracy: <code>{P.esc(c.key)}</code> (mean over samples "
        "per held-out problem).</p><table id=validation><thead><tr><th>step</th>"
        + "".join(f"<th>{P.esc(h)}</th>" for h in heads)
        + "</tr></thead><tbody><tr><td>accuracy</td>"
        + "".join(f"<td>{v}</td>" for v in vals)
        + "</tr></tbody></table>"
    )


def did_it_learn(runs: list[Run], images: dict[str, bytes]) -> str:
    body = []
    curves = []
    for run in runs:
        # the figure the recipe is about (launch.learning.accuracy_key), as the terminal's line reads it
        c = learning.curve(run.records, health._sel(run.config, "launch.learning.accuracy_key"))
        c.base = learning._json(run.folder / learning.BASE_FILE)
        c.final = learning._json(run.folder / learning.FINAL_FILE)
        curves.append(c)
    if len(runs) == 1:
        data = learning.plot(curves[0], runs[0].label)
    else:
        pts = []
        for ri, (run, c) in enumerate(zip(runs, curves, strict=True)):
            xs = sorted(c.accuracy)
            if xs:
                pts.append((ri, 0, (f"{run.label}: validation accuracy", xs, [c.accuracy[x] for x in xs])))
        data = plots.lines("learning curve", "accuracy / reward", _series(runs, [(LEARN_KEY, "reward mean")]),
                           size=plots.WIDE, points=pts)  # fmt: skip
    keys = sorted({c.key for c in curves if c.key})
    heads = [(run.label, line) for run in runs if (line := validation_line(run))]
    if heads:  # the headline first: the same line `make train` printed at the end of the run
        body.append("<p id=headline><b>" + "<br>".join(
            P.esc((f"{label}: " if len(runs) > 1 else "") + line[0].upper() + line[1:]) for label, line in heads)
            + "</b></p>")  # fmt: skip
    if data:
        images["learning.png"] = data
        body.append(P.figure("learning.png", data,
            f"Learning curve: reward mean of the training batches ({P.codes([LEARN_KEY])}) and validation accuracy"
            f" ({P.codes(keys) if keys else 'no validation in this run'}); dashed: the base model's sampled "
            "accuracy when the run folder has base_model.json.", wide=True))  # fmt: skip
    body += [learning_table(c) for c in curves]
    for run in runs:
        flat = flat_reward(run)
        if flat:
            body.append(f'<p class="note" id="flat-reward">{P.esc((run.label + ": ") if len(runs) > 1 else "")}'
                        f"{P.esc(flat)}.</p>")  # fmt: skip
    # the reward split
    panel = health.REWARD
    series = _series(runs, [(s.key, s.label) for s in panel.series])
    pts = []
    for ri, run in enumerate(runs):
        for mi, part in enumerate(("format", "acc")):
            key, xs, ys = health.validation(run, part)
            if key:
                pts.append(
                    (ri, mi, (f"{run.label + ': ' if len(runs) > 1 else ''}validation {part}", xs, ys))
                )
    if series:
        data = plots.lines(panel.title, panel.ylabel, series, size=plots.WIDE, points=pts, ylim=(-0.02, 1.02))
        images[panel.name] = data
        shown = [s.key for s in panel.series if any(s in health.present(r, panel) for r in runs)]
        body.append(P.figure(panel.name, data,
            f"{P.esc(panel.read)} Training: {P.codes(shown)}"
            + (" (<code>reward/*</code>: the reward tally, tools/reward/tally.py)" if len(shown) > 1 else "")
            + f"; validation: {P.codes(_val_keys(runs)) or 'none'}.", wide=True))  # fmt: skip
    # a part the reward did not return: said, not drawn at 0 (long addition has no format term)
    for s in panel.series[1:]:
        unlogged = [r.label for r in runs if r.tally_steps and s not in health.present(r, panel)]
        if unlogged:
            body.append(f'<p class="note" id="not-logged-{P.esc(s.key.split("/")[-1])}">{P.esc(s.label)} '
                        f"(<code>{P.esc(s.key)}</code>): not logged"
                        + (f" for {P.esc(', '.join(unlogged))}" if len(runs) > 1 else "")
                        + ": the run's reward function does not return it.</p>")  # fmt: skip
    split_missing = [r.label for r in runs if not r.tally_steps]
    if split_missing:
        body.append(
            f'<p class="note" id="reward-split-note">Format and accuracy per training step: not available for '
            f"{P.esc(', '.join(split_missing))}. verl logs only the combined score for a training step "
            "(<code>critic/score/mean</code>) and the parts for validation; the parts per step come from the reward "
            "tally (<code>reward-tally-&lt;attempt&gt;.jsonl</code>, tools/reward/tally.py), which this run folder "
            "does not have (a run made before it, or verl run by hand).</p>"
        )
    body.append("<p id=timeouts>Grader timeouts: " + "<br>".join(
        P.esc((f"{r.label}: " if len(runs) > 1 else "") + health.timeouts(r)) for r in runs) + "</p>")  # fmt: skip
    return P.section("learning", "Did it learn", "\n".join(body))


def did_it_reason(runs: list[Run], images: dict[str, bytes]) -> str | None:
    """R1-Zero's shape (tools/analysis/reasoning.py), for runs of the long-addition task (tiny-zero): accuracy
    and mean response length together, the trace rate, accuracy per difficulty, the figures against their
    bounds, and responses to one held-out problem at the start, the middle and the end."""
    pairs = [(r, p) for r in runs if (p := reasoning.picture(r)) is not None]
    if not pairs:
        return None
    pics = [p for _, p in pairs]
    data = reasoning.draw(pics)
    images["reasoning.png"] = data
    body = [P.figure("reasoning.png", data,
        "Left: held-out accuracy (sampled, mean over the digit buckets; validation points) and the mean response "
        "length of the training batches (<code>response_length/mean</code>, dashed) on a second axis. Middle: the "
        "share of responses that wrote the step-by-step trace (training: <code>reward/trace</code>; held-out: "
        "<code>val-aux/addition-&lt;n&gt;d/trace</code>). Right: held-out accuracy of each digit count. "
        "<code>actor/entropy</code> is aggregated with the run's <code>loss_agg_mode</code>: not comparable across "
        "loss modes.", wide=True)]  # fmt: skip
    kinds = [reasoning.kind_of(r.config) if r.config is not None else "main" for r, _ in pairs]
    table = [reasoning.checks(reasoning.figures(p), k) for p, k in zip(pics, kinds, strict=True)]
    names = [c.name for c in table[0]] if len(set(kinds)) == 1 else []
    if names:
        rows = [(n, [P.esc(t[i].line().split(": ", 1)[1]) + ("" if t[i].met else ' <b class="note">missed</b>')
                     for t in table]) for i, n in enumerate(names)]  # fmt: skip
        body.append(P.kv_table([p.label for p in pics], rows))
    else:
        body += [f"<p><b>{P.esc(p.label)}</b> ({k}):<br>" + "<br>".join(P.esc(c.line()) for c in t) + "</p>"
                 for p, k, t in zip(pics, kinds, table, strict=True)]  # fmt: skip
    edges = [(p.label, e) for p in pics for e in (reasoning.edge_line(p), reasoning.validity_line(p)) if e]
    if edges:
        body.append("<p>" + "<br>".join(P.esc((f"{label}: " if len(pics) > 1 else "") + e[0].upper() + e[1:])
                                        for label, e in edges) + "</p>")  # fmt: skip
    for p in pics:
        for step, (problem, responses) in p.examples.items():
            shown = "".join(f"<li><code>{P.esc(r)}</code></li>" for r in responses[:4])
            body.append(f"<p>{P.esc(p.label + ': ' if len(pics) > 1 else '')}step {step}, "
                        f"<code>{P.esc(problem)}</code><ul>{shown}</ul></p>")  # fmt: skip
    return P.section("reasoning", "Did it learn to reason longer", "\n".join(body))


def _val_keys(runs: list[Run]) -> list[str]:
    out = set()
    for run in runs:
        for part in ("format", "acc"):
            key, _, _ = health.validation(run, part)
            if key:
                out.add(key)
    return sorted(out)


def _mismatch_marks(runs: list[Run], panel: health.Panel) -> dict[str, Any]:
    """On the rollout-vs-actor panel: the flag bound (dashed) and each flagged step's worst token (markers)."""
    if panel.name != "rollout_probs.png":
        return {}
    points = []
    for ri, run in enumerate(runs):
        flagged = mismatch.verdict(run).flagged
        if flagged:
            ys = [get(run.steps[s], mismatch.MAX) for s in flagged]
            points.append((ri, 3, (f"{run.label}: above the bound" if len(runs) > 1 else "above the bound",
                                   flagged, ys)))  # fmt: skip
    bound = mismatch.bound_of(runs[0].config)
    return {"points": points, "hline": (bound, f"flag bound {bound:g}")}


def is_it_healthy(runs: list[Run], images: dict[str, bytes]) -> str:
    figs = []
    for panel in health.HEALTH:
        keys = [s.key for s in panel.series]
        series = _series(runs, [(s.key, s.label) for s in panel.series])
        if not series:
            figs.append(P.absent(panel.name, panel.title, panel.absent(runs[0].config), keys))
            continue
        data = plots.lines(panel.title, panel.ylabel, series, **_mismatch_marks(runs, panel))
        images[panel.name] = data
        shown = sorted({s.key for run in runs for s in health.present(run, panel)}, key=keys.index)
        notes = [
            (f"{run.label}: " if len(runs) > 1 else "") + n for run in runs for n in health.notes(run, panel)
        ]
        missing = [k for k in keys if k not in shown]
        caption = f"<b>{P.esc(panel.title)}</b> (verl: {P.codes(shown)}). {P.esc(panel.read)}"
        if missing:
            caption += f" Not logged in this run: {P.codes(missing)}."
        if notes:
            caption += "".join(f' <span class="note">{P.esc(n)}.</span>' for n in notes)
        figs.append(P.figure(panel.name, data, caption))
    return P.section("health", "Is it healthy", f'<div class="figs">{"".join(figs)}</div>')


def reward_column(rows: list[dict[str, Any]]) -> str:
    """What the reward (s) column of a run's table shows, and why."""
    out = []
    if any(r["reward_s"] is not None and not r["reward_in_gen"] for r in rows):
        out.append("reward (s): <code>timing_s/reward</code>, verl's reward phase after generation.")
    if any(r["reward_in_gen"] for r in rows):
        out.append(
            "reward (s) \u201cin gen\u201d: verl 0.9.1 logs no <code>timing_s/reward</code> here: its reward-loop "
            "workers score each response inside the rollout as it finishes, so that time is part of generate. The "
            "column shows the reward function's own seconds summed over its calls (<code>reward/seconds</code>, "
            "tools/reward/tally.py), not stacked in the split."
        )
    if any(r["reward_s"] is None for r in rows):
        out.append(
            "reward (s) \u201c-\u201d: verl logged no <code>timing_s/reward</code> (verl 0.9.1 scores the rule reward "
            "inside the rollout, so its time is part of generate) and the run folder has no reward tally for "
            "those steps (tools/reward/tally.py) with the reward function's own seconds."
        )
    return " ".join(out)


def where_time_went(runs: list[Run], rows: list[list[dict[str, Any]]], images: dict[str, bytes]) -> str:
    figs = []
    unit = runs[0].dev.unit
    # the reward function's time measured inside generate (verl 0.9.1) is not stacked on top of it
    parts = [("reward_stack_s", lab) if k == "reward_s" else (k, lab) for k, lab in SPLIT]
    if len(runs) == 1:
        data = plots.split_bars(f"{runs[0].label}: step time split", rows[0], parts)
    else:
        data = plots.split_means(
            "step time split", [(r.label, rs) for r, rs in zip(runs, rows, strict=True)], parts
        )
    images["step_time.png"] = data
    figs.append(P.figure("step_time.png", data,
        "Step time split: <code>timing_s/gen</code> (generate; <code>timing_s/generate_sequences</code> on verl 0.6), "
        "reshard (<code>timing_s/update_weights</code>, or gen - generate_sequences), <code>timing_s/reward</code>, "
        "<code>timing_s/old_log_prob</code>, <code>timing_s/ref</code>, <code>timing_s/update_actor</code>; other: "
        "the rest of <code>timing_s/step</code>.", wide=True))  # fmt: skip
    tps = []
    for ri, (run, rs) in enumerate(zip(runs, rows, strict=True)):
        pts = [
            (r["step"], r["tokens_per_s_per_device"]) for r in rs if r["tokens_per_s_per_device"] is not None
        ]
        if pts:
            tps.append((ri, 0, (run.label if len(runs) > 1 else f"tokens/s per {unit}",
                                [p[0] for p in pts], [p[1] for p in pts])))  # fmt: skip
    if tps:
        data = plots.lines(f"throughput: tokens/s per {unit}", f"tokens/s per {unit}", tps)
        images["throughput.png"] = data
        figs.append(P.figure("throughput.png", data,
            f"Throughput: prompt + response tokens of the step / <code>timing_s/step</code> / {P.esc(unit)}s "
            "(<code>perf/total_num_tokens</code>; equals verl's <code>perf/throughput</code> x dies per device)."))  # fmt: skip
    else:
        figs.append(P.absent("throughput.png", "Throughput", "no step logged its token count and time",
                             ["perf/total_num_tokens", "timing_s/step"]))  # fmt: skip
    notes = [
        (f"{P.esc(run.label)}: " if len(runs) > 1 else "") + reward_column(rs)
        for run, rs in zip(runs, rows, strict=True)
    ]
    why = "<br>".join(notes)
    tables = []
    for i, (run, rs) in enumerate(zip(runs, rows, strict=True)):
        head = f"<h3>{P.esc(run.label)}</h3>" if len(runs) > 1 else ""
        tables.append(head + P.step_table(rs, run.dev.unit, f"steps-{i}"))
    body = (
        f'<div class="figs">{"".join(figs)}</div><p id="reward-column">{why}</p>'
        f"<p>Tokens/s per {P.esc(unit)}: prompt + response tokens of the step / step time / {P.esc(unit)}s. "
        "Reshard: weight sync around the rollout.</p>" + "".join(tables)
    )
    return P.section("time", "Where did the time go", body)


def build(runs: list[Run], out: Path) -> Built:
    images: dict[str, bytes] = {}
    rows = [rows_of(r) for r in runs]
    title = runs[0].label if len(runs) == 1 else " vs ".join(r.label for r in runs)
    sources = "; ".join(", ".join(str(s) for s in r.sources) for r in runs)
    n = ", ".join(f"{len(r.steps)}" for r in runs)
    subtitle = (
        f"{n} training steps from {P.esc(sources)}; made {datetime.datetime.now():%Y-%m-%d %H:%M} by "
        "<code>make report</code> (tools/report)."
    )
    sections = [
        what_ran(runs, out),
        did_it_learn(runs, images),
        did_it_reason(runs, images) or "",
        paper.section(runs, images) or "",
        is_it_healthy(runs, images),
        where_time_went(runs, rows, images),
    ]
    ov = overlap.section(runs, images)
    if ov:
        sections.append(ov)
    return Built(title, P.document(title, subtitle, sections), images, rows)
