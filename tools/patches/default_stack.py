"""The default stack: patches/stacks.toml names it; the trees' places, the superproject's gitlinks and
.gitmodules follow it.

The default stack's trees are at third_party/<upstream> and are submodules (gitlinks at the pins); every
other stack's trees are plain ignored folders at third_party/stacks/<stack>/<upstream>
(tools.patches.config.stack_dir). `python3 -m tools.patches set-default <name>` changes the default and
moves the trees; `make bootstrap` moves trees from the earlier layout (third_party/<stack>/<upstream>).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tools import atomic
from tools import stacks as st
from tools.env import requirements
from tools.errors import UserError
from tools.patches import sources
from tools.patches.config import REPO, THIRD_PARTY, gitlinks, legacy_stack_dir, load_upstreams, stack_dir


def set_default(name: str, root: Path = REPO) -> list[str]:
    """Make `name` the default stack: stacks.toml, and the trees' places (the old default's trees move to
    third_party/stacks/<old>/, the new default's to third_party/), the third_party/ gitlinks, .gitmodules
    and the root requirements.txt follow it. Returns what was done, a line each."""
    stacks = st.load(root)
    if name not in stacks:
        raise UserError(f"unknown stack {name!r}", fix=f"pick one of: {', '.join(stacks)}")
    text = (root / st.STACKS_TOML).read_text()
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("default ="):
            lines[i] = f'default = "{name}"\n'
    moves = _moves(root, stacks, name)  # refused before anything changes
    atomic.write_bytes(root / st.STACKS_TOML, "".join(lines).encode())
    done = _move(moves, root)
    if moves:
        done.append(
            "the editable installs of the moved trees: run `make bootstrap STACK=<stack>` for each stack"
        )
    done += link_default_stack(root)
    if requirements.inputs(root).is_file():  # the stack has an NPU profile
        done.append(requirements.write(root) + "; commit it with the stack change")
    return done


def link_default_stack(root: Path = REPO) -> list[str]:
    """Record the default stack's trees as the superproject's submodules: its gitlinks (at the pins) and
    .gitmodules entries; every other gitlink under third_party/ is removed from the index (the folder and
    the tree in it stay). Returns what changed, a line each."""
    default = st.default(root).name
    ups = load_upstreams(root, default)
    want = {u.path.as_posix(): u for u in ups.values() if u.commit}  # no commit known: no gitlink
    done = []
    for p in gitlinks(root, rev=None):
        if p not in want:
            subprocess.run(["git", "update-index", "--force-remove", "--", p], cwd=root, check=True)
            done.append(f"{p}: gitlink removed (not the default stack)")
    lines = []
    for p, up in want.items():
        lines += [f'[submodule "{p}"]', f"\tpath = {p}", f"\turl = {up.url}", "\tignore = all"]
        if gitlinks(root, rev=None).get(p) != up.commit:
            subprocess.run(
                ["git", "update-index", "--add", "--cacheinfo", f"160000,{up.commit},{p}"],
                cwd=root,
                check=True,
            )
            done.append(f"{p}: gitlink at {up.commit[:12]} ({up.tag})")
        # also where the profile makes no tree (`commit -a` would read that gitlink as deleted)
        sources.protect_gitlink(up)
    atomic.write_bytes(root / ".gitmodules", ("\n".join(lines) + "\n").encode())
    done.append(
        f".gitmodules: the {len(want)} trees of stack {default}; commit with `git commit .gitmodules`"
    )
    return done


def _moves(root: Path, stacks: dict, new_default: str) -> list[tuple[Path, Path]]:
    """The moves of the existing trees from their places now to those with `new_default` as the default
    (relative paths); refused, with nothing moved, when a destination is taken by a folder that is not
    itself moving away."""
    moves = []
    for stack in stacks:
        for up in load_upstreams(root, stack).values():
            dst = stack_dir(stack, root, new_default) / up.name
            if dst != up.path and (root / up.path).exists():
                moves.append((up.path, dst))
    leaving = {src for src, _ in moves}
    for _, dst in moves:
        if (root / dst).exists() and dst not in leaving:
            raise UserError(
                f"{dst} exists and is not a tree of the stacks: the new default stack's tree cannot move there",
                fix=f"move {dst} aside (nothing was changed)",
            )
    return moves


def _move(moves: list[tuple[Path, Path]], root: Path) -> list[str]:
    """Move the trees in two steps (each to a temporary name first), so that swapping places never clashes."""
    parked = []
    for i, (src, dst) in enumerate(moves):
        tmp = THIRD_PARTY / f".moving-{i}"
        (root / src).rename(root / tmp)
        parked.append((tmp, src, dst))
    for tmp, _, dst in parked:
        (root / dst).parent.mkdir(parents=True, exist_ok=True)
        (root / tmp).rename(root / dst)
    _remove_if_empty(root, [src.parent for src, _ in moves])
    return [f"{src} -> {dst}" for src, dst in moves]


def adopt_legacy_trees(root: Path = REPO) -> list[str]:
    """Move the trees of the earlier layout (third_party/<stack>/<upstream>, every stack) to their places
    now, where nothing is there yet; local edits and commits in them move along. What moved, a line each."""
    moved = []
    for stack in st.load(root):
        for up in load_upstreams(root, stack).values():
            old = legacy_stack_dir(stack) / up.name
            if old != up.path and (root / old).is_dir() and not (root / up.path).exists():
                (root / up.path).parent.mkdir(parents=True, exist_ok=True)
                (root / old).rename(root / up.path)
                moved.append((old, up.path))
    _remove_if_empty(root, [old.parent for old, _ in moved])
    return [f"{old} -> {new} (the default stack's trees are at third_party/ now)" for old, new in moved]


def _remove_if_empty(root: Path, folders: list[Path]) -> None:
    """Remove the folders the trees left (third_party/<stack>/, third_party/stacks/<stack>/), when empty."""
    for d in sorted(set(folders), key=lambda p: -len(p.parts)):
        while d != THIRD_PARTY and (root / d).is_dir() and not any((root / d).iterdir()):
            (root / d).rmdir()
            d = d.parent
