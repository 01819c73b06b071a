"""The stacks: named sets of upstream pins, patch series, locks and recipes (patches/stacks.toml).

    published   the mid-2025 pins of the published run (verl 0.6.0, vLLM 0.9.1, megatron-core 0.12.1, ...)
    current     today's upstreams (verl 0.9.1, vLLM/vllm-ascend 0.23, megatron-core 0.16, ...)

Which stack a command works on, first match wins: `--stack` / `make ... STACK=`, the environment variable
ASCEND_R1_STACK, the stack of the virtual environment the command runs in (bootstrap records it), the
default in patches/stacks.toml. Each stack and profile has its own environment, `.venv-<stack>-<profile>`.

Standard library only: the Makefile and bootstrap call it before any virtual environment exists.

    python3 -m tools.stacks list                       the stacks, the default marked
    python3 -m tools.stacks default                    the default's name
    python3 -m tools.stacks venv [--stack S] [--profile P]   the environment's folder (for the Makefile)
    python3 -m tools.stacks no-env --venv V --target T      the error of a make target whose environment V
                                                             is missing (the Makefile's $(PY) then)

Making another stack the default moves the gitlinks too: `python3 -m tools.patches set-default <name>`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tools.errors import UserError, run_cli

REPO = Path(__file__).resolve().parents[1]
STACKS_TOML = Path("patches") / "stacks.toml"
ENV_VAR = "ASCEND_R1_STACK"
PROFILES = ("cpu", "npu", "cuda")
# what `make bootstrap` records in each environment it makes (tools/bootstrap.py)
STATE_FILE = "ascend-r1-bootstrap.json"


@dataclass(frozen=True)
class Stack:
    name: str
    description: str
    npu: dict[str, str] = field(default_factory=dict)  # cann, torch-npu, torch an NPU node must have
    default: bool = False

    @property
    def patches(self) -> Path:
        return Path("patches") / self.name

    @property
    def upstreams_toml(self) -> Path:
        return self.patches / "upstreams.toml"


def load(root: Path = REPO) -> dict[str, Stack]:
    """Every stack in patches/stacks.toml, in file order."""
    path = root / STACKS_TOML
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"{path} not found", fix="run from the ascend-r1 checkout") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: not valid TOML: {e}") from None
    default = data.get("default")
    stacks = {}
    for name, table in data.items():
        if name == "default":
            continue
        if not isinstance(table, dict) or not isinstance(table.get("description"), str):
            raise UserError(f'{STACKS_TOML} [{name}]: expected a table with a `description = "..."`')
        npu = table.get("npu", {})
        stacks[name] = Stack(name, table["description"], {k: str(v) for k, v in npu.items()}, name == default)
    if default not in stacks:
        raise UserError(
            f"{STACKS_TOML}: default = {default!r} is not one of the stacks ({', '.join(stacks)})",
            fix=f"set `default = \"<name>\"` to one of: {', '.join(stacks)}",
        )
    return stacks


def default(root: Path = REPO) -> Stack:
    return next(s for s in load(root).values() if s.default)


def venv_stack(prefix: str = sys.prefix) -> str | None:
    """The stack of the virtual environment this Python runs in (None outside one made by bootstrap)."""
    try:
        return json.loads((Path(prefix) / STATE_FILE).read_text()).get("stack")
    except (OSError, ValueError):
        return None


def resolve(name: str | None = None, root: Path = REPO) -> Stack:
    """The stack a command works on: `name`, else $ASCEND_R1_STACK, else the running venv's (when `root` is
    this checkout, whose environment it is), else the default.

    An unknown name is an error that lists the stacks."""
    stacks = load(root)
    chosen = name or os.environ.get(ENV_VAR) or (venv_stack() if Path(root).resolve() == REPO else None)
    if not chosen:
        return default(root)
    if chosen not in stacks:
        where = "STACK=" if name else (f"{ENV_VAR}=" if os.environ.get(ENV_VAR) else f"{sys.prefix}: stack ")
        raise UserError(
            f"unknown stack {where}{chosen!r}: the stacks are {', '.join(describe(s) for s in stacks.values())}",
            fix="pick one with STACK=<name> (make), --stack <name> or ASCEND_R1_STACK=<name>",
        )
    return stacks[chosen]


def describe(stack: Stack) -> str:
    return f"{stack.name}{' (default)' if stack.default else ''}"


def detect_profile() -> str:
    """npu when the Ascend driver is present, cuda with an NVIDIA driver, else cpu."""
    if shutil.which("npu-smi") or any(Path("/dev").glob("davinci[0-9]*")):
        return "npu"
    if shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


def venv_name(stack: str, profile: str) -> str:
    """The environment of a stack and profile, relative to the checkout."""
    return f".venv-{stack}-{profile}"


def check_venv(venv: Path, stack: str, profile: str) -> None:
    """Refuse an environment that bootstrap made for another stack or profile (its state file says)."""
    try:
        state = json.loads((venv / STATE_FILE).read_text())
    except (OSError, ValueError):
        return  # not made yet, or not by bootstrap
    made = (state.get("stack", "published"), state.get("profile"))  # before stacks: published
    if made[1] and made != (stack, profile):
        raise UserError(
            f"{venv} was made for stack {made[0]}, profile {made[1]}, not stack {stack}, profile {profile}",
            fix=f"use it with STACK={made[0]} PROFILE={made[1]}, or leave VENV= unset: each stack and profile"
            f" gets its own ({venv_name(stack, profile)})",
        )


def bootstrapped(profile: str, root: Path = REPO) -> list[tuple[str, str]]:
    """(stack, environment) of every stack whose environment for `profile` exists in the checkout."""
    return [
        (name, venv_name(name, profile))
        for name in load(root)
        if (root / venv_name(name, profile) / "bin" / "python").exists()
    ]


def not_bootstrapped(target: str, venv: str, stack: str | None = None, profile: str | None = None,
                     root: Path = REPO) -> UserError:  # fmt: skip
    """The error of a make target whose stack has no environment here: which stacks have one, and the two
    ways on (another stack, or bootstrap this one)."""
    chosen, profile = resolve(stack, root).name, profile or detect_profile()
    made = bootstrapped(profile, root)
    command = f"make {target}" if target else "the command"
    if not made:
        return UserError(
            f"{command}: no stack is bootstrapped here ({venv} and the other stacks' .venv-<stack>-{profile}"
            " do not exist)",
            fix=f"make bootstrap (stack {chosen}), or make bootstrap STACK=<one of {', '.join(load(root))}>",
        )
    others = ", ".join(f"{name} ({env})" for name, env in made)
    return UserError(
        f"{command}: stack {chosen} is not bootstrapped here ({venv} does not exist); bootstrapped: {others}",
        fix=f"run it on a bootstrapped stack: {command} STACK={made[0][0]}; or bootstrap this one: make "
        f"bootstrap STACK={chosen}",
    )


def cann_version() -> str | None:
    """The installed CANN toolkit's version (set_env.sh exports ASCEND_TOOLKIT_HOME), None when absent."""
    home = os.environ.get("ASCEND_TOOLKIT_HOME", "/usr/local/Ascend/ascend-toolkit/latest")
    for rel in ("version.cfg", "compiler/version.info", "runtime/version.info"):
        p = Path(home, rel)
        if p.is_file():
            for line in p.read_text().splitlines():
                if "version=" in line.lower():
                    return line.split("=", 1)[1].strip()
    return None


def installed_npu_versions(root: Path = REPO) -> dict[str, str | None]:
    """What this node has of what any stack's NPU profile names: CANN and the Python distributions."""
    from importlib import metadata  # noqa: PLC0415

    found: dict[str, str | None] = {"cann": cann_version()}
    for name in sorted({k for s in load(root).values() for k in s.npu} - {"cann"}):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _matches(want: str, have: str | None) -> bool:
    """8.2.RC1 matches 8.2.RC1 and 8.2.RC1.alpha003; 2.5.1 matches 2.5.1+cpu-less local builds too."""
    if not have:
        return False
    have = have.split("+", 1)[0]
    return have == want or have.startswith(want + ".")


def npu_fit(stack: Stack, found: dict[str, str | None], root: Path = REPO) -> str | None:
    """None when this node's CANN, torch-npu and torch are what `stack` needs; else one line that says what
    differs and names the stack that fits (or that none does)."""
    wrong = [f"{k} {found.get(k) or 'missing'} (stack {stack.name} needs {v})" for k, v in stack.npu.items()
             if not _matches(v, found.get(k))]  # fmt: skip
    if not wrong:
        return None
    fits = [
        s.name
        for s in load(root).values()
        if s.npu and all(_matches(v, found.get(k)) for k, v in s.npu.items())
    ]
    hint = (
        f"stack {fits[0]} fits this node: use STACK={fits[0]}"
        if fits
        else "no stack fits this node: install "
        + ", ".join(f"{k} {v}" for k, v in stack.npu.items())
        + f" for stack {stack.name}"
    )
    return f"this node has {'; '.join(wrong)}; {hint}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.stacks", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the stacks, the default marked")
    sub.add_parser("default", help="the default stack's name")
    v = sub.add_parser("venv", help="the environment folder of a stack and profile")
    v.add_argument("--stack")
    v.add_argument("--profile", choices=PROFILES)
    n = sub.add_parser("no-env", help="the error of a make target whose stack's environment is missing")
    n.add_argument("--stack")
    n.add_argument("--profile", choices=PROFILES)
    n.add_argument("--venv", required=True)
    n.add_argument("--target", default="")
    n.add_argument("rest", nargs=argparse.REMAINDER, help="the command it stands in for (ignored)")
    d = sub.add_parser("set-default", help="moved: python3 -m tools.patches set-default <name>")
    d.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "list":
        for s in load().values():
            print(f"{describe(s):<22} {s.description}")
    elif args.command == "default":
        print(default().name)
    elif args.command == "venv":
        print(venv_name(resolve(args.stack).name, args.profile or detect_profile()))
    elif args.command == "no-env":
        raise not_bootstrapped(args.target, args.venv, args.stack, args.profile)
    else:
        raise UserError(
            "the default stack moves its gitlinks, so the patch tools change it",
            fix=f"python3 -m tools.patches set-default {args.name}",
        )
    return 0


if __name__ == "__main__":
    run_cli(main)
