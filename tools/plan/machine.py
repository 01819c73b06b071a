"""Machine rules: patches applied and pins right; torch / torch_npu / CANN versions and the lock;
environment variables (per-node *_SOCKET_IFNAME naming a real interface). Skipped with --no-env;
versions and environment are skipped where the recipe's device is absent."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tools import stacks
from tools.env import lock
from tools.patches import config as pc
from tools.patches import manager
from tools.plan import inputs
from tools.plan.context import Context
from tools.recipes import recipe as R
from tools.stacks import detect_profile

G = "machine"


def check(ctx: Context) -> None:
    if not ctx.check_machine:
        for rule in ("patches applied, pins right", "versions", "environment variables", "data", "weights"):
            ctx.skip(G, rule, "--no-env")
        return
    patch_rules(ctx)
    here, target = detect_profile(), ctx.launch.device
    if target != here:
        why = f"recipe runs on {target}, this machine has {here}: run `make plan` on a node"
        ctx.skip(G, "versions", why)
        ctx.skip(G, "environment variables", why)
    else:
        version_rules(ctx)
        env_rules(ctx)
    inputs.data_rules(ctx)
    inputs.weight_rules(ctx)


@dataclass(frozen=True)
class SeriesState:
    """One upstream's series as tools.patches.manager.patch_status reports it."""

    upstream: str
    text: str  # the status's display ("12/12 applied", "0/12 (pristine)", "stale: ...")
    applied: bool  # PatchStatus.ready: every patch of the series applied, nothing else on top


def series_states(ctx: Context) -> list[SeriesState]:
    ups = pc.load_upstreams(R.REPO)
    here = detect_profile()
    need = [n for n, u in ups.items() if ctx.launch.device in u.install]
    if ctx.launch.device != here:
        elsewhere = [n for n in need if here not in ups[n].install]
        if elsewhere:
            ctx.skip(
                G,
                "patches for " + ", ".join(elsewhere),
                f"only the {ctx.launch.device} profile has these trees: check on a node",
            )
        need = [n for n in need if here in ups[n].install]
    states = [(n, manager.patch_status(ups[n])) for n in need if n in ups]
    return [SeriesState(n, st.row()["patches"], st.ready) for n, st in states]


def patch_rules(ctx: Context) -> None:
    try:
        states = series_states(ctx)
        bad = [s for s in states if not s.applied]
        ctx.add(
            G,
            "patches applied",
            not bad,
            ", ".join(f"{s.upstream} {s.text}" for s in states),
            "run `make apply-patches` (or `make bootstrap`): "
            + "; ".join(f"{s.upstream}: {s.text}" for s in bad),
        )
        problems = pc.check_pins(R.REPO)
        ctx.add(
            G,
            "pins right",
            not problems,
            "stacks' upstreams.toml = gitlinks = .gitmodules" if not problems else problems[0],
            "; ".join(problems),
        )
    except Exception as e:  # the patch manager's own errors (UserError, git failures) carry their fixes
        ctx.add(G, "patches applied", False, "-", str(e))


def version_rules(ctx: Context) -> None:
    """The stack's versions: on an NPU node CANN, torch-npu and torch as patches/stacks.toml names them
    (naming the stack that fits when they differ); every profile's environment as its lock pins it."""

    stack = stacks.load(R.REPO)[ctx.launch.stack]
    if ctx.launch.device == "npu":
        found = stacks.installed_npu_versions()
        wrong = stacks.npu_fit(stack, found, R.REPO)
        ctx.add(
            G,
            "versions: CANN, torch-npu, torch",
            wrong is None,
            ", ".join(f"{k} {found.get(k) or 'missing'}" for k in stack.npu) + f" (stack {stack.name})",
            wrong or "",
        )
    lock_rule(ctx, stack.name)


def lock_rule(ctx: Context, stack: str) -> None:
    from importlib import metadata

    spec = lock.profile_spec(stack, ctx.launch.device)
    pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", (R.REPO / spec.path).read_text(), re.M))
    differ = []
    for name, want in pins.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != want:
            differ.append(f"{name} {have or 'missing'} (lock {want})")
    ctx.add(
        G,
        "versions: the environment is the lock",
        not differ,
        f"{len(pins) - len(differ)} of {len(pins)} as {spec.path} pins them"
        + (f"; {', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}" if differ else ""),
        f"run `make bootstrap STACK={stack} PROFILE={ctx.launch.device}`",
    )


def env_rules(ctx: Context) -> None:
    env = R.verl_env(ctx.cfg)
    clash = {k: (os.environ[k], v) for k, v in env.items() if k in os.environ and os.environ[k] != v}
    ctx.add(
        G,
        "environment variables",
        not clash,
        f"{len(env)} set by the recipe" + (f"; differing in your shell: {sorted(clash)}" if clash else ""),
        "the recipe's values win for the run; unset or align: "
        + ", ".join(f"{k}={mine!r} (recipe {theirs!r})" for k, (mine, theirs) in clash.items()),
        warn=True,
    )
    nodes = ctx.launch.get("nodes")
    if isinstance(nodes, int) and nodes > 1:
        for var in ctx.launch.get("node_env") or []:
            val = os.environ.get(var) or env.get(var)
            ok = bool(val) and Path("/sys/class/net", val).exists()
            ctx.add(
                G,
                f"{var}",
                ok,
                f"{var}={val}",
                f"export {var}=<the interface of the cluster network on this node> "
                f"(one of: {', '.join(sorted(os.listdir('/sys/class/net')))})",
            )
