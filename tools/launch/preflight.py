"""What `make train` checks before verl starts, on the composed Run: the recipe is for this machine's
device, the stack's trees carry their series, verl is installed, the planner's rules pass (`make plan`),
and the data has batches for every step asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from tools.data.parquet import readable
from tools.launch.run import Run, TrainError
from tools.patches import manager
from tools.patches.config import load_upstreams
from tools.plan import FAIL, WARN, data_batches, plan, render, steps_fix, train_command
from tools.plan.context import check_integer

REPO = Path(__file__).resolve().parents[2]


def machine(run: Run) -> None:
    """A recipe for an accelerator this machine does not have (the 671B recipe on a CPU machine, say) is
    refused first, before anything is made or checked: what it needs, and how it is run instead."""
    launch, device = run.launch, run.launch.get("device")
    if device in (None, run.profile):
        return
    nodes, per_node = launch.get("nodes", 1), launch.get("devices_per_node", 1)
    unit, hardware = str(launch.get("device_unit") or device).strip(), launch.get("hardware", "?")
    ranks = (
        f"{nodes * per_node} {device.upper()} {'dies' if launch.get('dies_per_device', 1) > 1 else 'devices'}"
    )
    paths = launch.get("paths") or {}
    needs = [f"{what} at {paths[key]} (launch.paths.{key})"
             for key, what in (("mcore", "the Megatron weights"), ("hf_model", "the HF model"), ("data", "the data"))
             if paths.get(key)]  # fmt: skip
    needs_text = ", ".join(needs[:-1]) + " and " + needs[-1] if len(needs) > 1 else "".join(needs)
    r = run.recipe
    here = f"here: make plan RECIPE={r} (the preflight) or make train RECIPE={r} DRY_RUN=1 (the verl command)"
    if nodes > 1:
        kind = (
            f"a cluster recipe: it trains on {ranks} on {nodes} {unit} nodes ({hardware}, {per_node} a node)"
        )
        how = (
            f"on the cluster: make prepare RECIPE={r} (weights and data), then make ray-head RECIPE={r} on the"
            f" head node, make ray-worker RECIPE={r} HEAD=<ip:port> on the others and make ray-job RECIPE={r}"
            f" HEAD=<ip:port>; or a scheduler's job: make slurm RECIPE={r} > job.sbatch, make kuberay RECIPE={r}"
            f" > rayjob.yaml; {here}"
        )
    else:
        kind = f"a recipe for one {hardware} node: it trains on {ranks}"
        how = f"on such a node: make bootstrap, make prepare RECIPE={r} (weights and data), make train RECIPE={r}; {here}"
    raise TrainError(
        f"recipe {r} is {kind}, with {needs_text or 'its weights and data'}; this machine has no {device.upper()}"
        f" (profile {run.profile}, recipe launch.device={device})",
        fix=how,
    )


def trees(cfg: Any, profile: str) -> None:
    """The stack's trees exist and carry their series (those this profile installs), before verl starts."""
    import importlib.util

    for up in load_upstreams(REPO).values():
        if profile not in up.install:
            continue
        st = manager.patch_status(up)
        if not st.ready:
            row = st.row()
            raise TrainError(
                f"{up.path} ({up.ref}) is not ready: sources {row['source']}, patches {row['patches']}",
                fix=f"make bootstrap STACK={up.stack}   (or make apply-patches STACK={up.stack} UP={up.name})",
            )
    # found, not imported: importing verl takes the launcher ~6-12 s (torch, tensordict, transformers) and
    # keeps ~0.5 GiB resident in it for the whole run, for nothing the launcher uses
    if importlib.util.find_spec("verl") is None:
        raise TrainError("verl is not installed in this environment", fix="make bootstrap")


def planner(run: Run, out: TextIO) -> None:
    """`make plan` before anything starts, on the run's config: a failing rule stops the run with the
    planner's table."""
    p = plan(run.recipe, list(run.overrides), cfg=run.cfg, modes_too=False)  # make plan prints the modes
    if not p.ok:
        raise TrainError(
            "the preflight planner found problems; nothing was started:\n" + render(p),
            fix=f"fix the FAIL rows above (`make plan RECIPE={run.recipe}` shows them again)",
        )
    warnings = [r for r in p.results if r.status == WARN]
    out.write(
        f"preflight: {sum(r.status != FAIL for r in p.results)} rules checked, {len(warnings)} warnings"
        f" ({p.seconds:.1f} s; make plan RECIPE={run.recipe} for the table)\n"
    )
    for r in warnings:
        out.write(f"  WARN {r.rule}: {r.values}\n")


def batches(run: Run, start: int, steps: int) -> None:
    """Refuse more steps than the training data has batches for: verl would stop early, silently."""
    v = run.cfg.verl
    train_files = v.data.get("train_files")
    files = [train_files] if isinstance(train_files, str) else list(train_files or [])
    if not files or not all(readable(f) for f in files):
        return  # the planner reports missing or damaged data (tools.data.parquet)
    batch, epochs = (
        check_integer(x, low=1)
        for x in (v.data.get("gen_batch_size") or v.data.train_batch_size, v.trainer.get("total_epochs") or 1)
    )
    if not (isinstance(batch, int) and isinstance(epochs, int)):
        return  # the planner names the bad value
    b = data_batches(train_files if isinstance(train_files, str) else files, batch, epochs)
    if start + steps <= b.total:
        return
    asked = f"steps {start + 1}..{start + steps}" + (f" (resuming after step {start})" if start else "")
    overrides = list(run.overrides)
    again = train_command(run.recipe, run.launch.stack, " ".join(["--fresh", *overrides]))
    raise TrainError(
        f"recipe {run.recipe} asks for {asked} but {b.describe()} (verl.data, verl.trainer.total_epochs)",
        fix=steps_fix(run.recipe, run.launch.stack, overrides, start + steps, b)
        + (f"; or start over: {again}" if start else ""),
    )
