"""The default stack: patches/stacks.toml names it, and the superproject's gitlinks and .gitmodules follow it.

Only the default stack's trees are submodules (gitlinks at the pins); every other stack's trees are plain
ignored folders beside them. `python3 -m tools.patches set-default <name>` changes the default.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tools import atomic
from tools import stacks as st
from tools.env import requirements
from tools.errors import UserError
from tools.patches.config import REPO, gitlinks, load_upstreams


def set_default(name: str, root: Path = REPO) -> list[str]:
    """Make `name` the default stack: stacks.toml, and the third_party/ gitlinks, .gitmodules and the root
    requirements.txt follow it.

    The trees stay where they are (third_party/<stack>/<upstream>); only which of them the superproject
    records as submodules changes. Returns what was done, a line each."""
    stacks = st.load(root)
    if name not in stacks:
        raise UserError(f"unknown stack {name!r}", fix=f"pick one of: {', '.join(stacks)}")
    text = (root / st.STACKS_TOML).read_text()
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("default ="):
            lines[i] = f'default = "{name}"\n'
    atomic.write_bytes(root / st.STACKS_TOML, "".join(lines).encode())
    done = link_default_stack(root)
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
        if (root / p).exists():  # keep `git add -A` / `commit -a` from moving it to the patched HEAD
            subprocess.run(["git", "update-index", "--skip-worktree", "--", p], cwd=root, check=True)
    atomic.write_bytes(root / ".gitmodules", ("\n".join(lines) + "\n").encode())
    done.append(
        f".gitmodules: the {len(want)} trees of stack {default}; commit with `git commit .gitmodules`"
    )
    return done
