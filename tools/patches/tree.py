"""A tree's standing under the manager: its pristine base, and the user's work on top that nothing may destroy.

Below both `sources` (which replaces a tree's base) and `manager` (which moves HEAD over the series): each
refuses to run over edits or commits that are not exported.
"""

from __future__ import annotations

from pathlib import Path

from tools.errors import UserError
from tools.patches import git as g
from tools.patches import stamp
from tools.patches.config import Upstream

BASE_REF = "refs/ascend-r1/base"  # the pristine commit of the pin (git) or of the imported release archive
BRANCH = "ascend-r1"  # the branch the manager keeps the tree on


def base(tree: Path) -> str | None:
    """The pristine base commit, None when the tree has none."""
    return g.rev(tree, BASE_REF) if g.is_repo(tree) else None


def require_tree(up: Upstream) -> str:
    """The tree's pristine base commit; a clear error when there are no sources."""
    if not g.is_repo(up.tree):
        raise UserError(
            f"{up.tree} has no sources",
            fix=f"run `make bootstrap STACK={up.stack}` (it fetches them from git or PyPI)",
        )
    base = g.rev(up.tree, BASE_REF)
    if base is None:
        raise UserError(
            f"{up.tree} has no pristine base ({BASE_REF})",
            fix=f"run `make bootstrap STACK={up.stack}`, which records it",
        )
    return base


def unexported_commits(up: Upstream, base: str) -> list[str]:
    """Commits on top of the base that the series does not hold (user work that export would keep)."""
    head = g.rev(up.tree, "HEAD")
    st = stamp.read(up.tree)
    applied = st.get("head")
    if st.get("applying"):
        return []  # an apply of ours was interrupted: the commits on top are the series' own
    if head in (base, applied):
        return []
    if applied and g.git(up.tree, "merge-base", "--is-ancestor", head, applied, check=False).returncode == 0:
        return []  # HEAD is part of what the manager itself applied
    if g.git(up.tree, "merge-base", "--is-ancestor", base, head, check=False).returncode != 0:
        return [f"HEAD {head[:12]} is not on top of the pristine base {base[:12]}"]
    since = (
        applied
        if applied
        and g.git(up.tree, "merge-base", "--is-ancestor", applied, head, check=False).returncode == 0
        else base
    )
    return g.out(up.tree, "log", "--format=%h %s", f"{since}..HEAD").splitlines()


def guard_user_work(up: Upstream, action: str) -> None:
    """Refuse to `action` when the tree holds local edits or commits that are not exported."""
    base = require_tree(up)
    if g.am_in_progress(up.tree):
        if stamp.read(up.tree).get("applying"):
            return  # our own interrupted apply: nothing of the user's is in it
        raise UserError(
            f"{up.tree}: a `git am` is in progress",
            fix=f"finish it (git -C {up.path} am --continue) "
            f"or drop it (git -C {up.path} am --abort), then retry",
        )
    dirty = g.dirty_files(up.tree)
    if dirty:
        listed = "\n    ".join(dirty[:20])
        raise UserError(
            f"{up.tree} has local edits; will not {action}:\n    {listed}",
            fix=f"keep them: `git -C {up.path} commit -am '<{up.name}: area: summary>'` then "
            f"`make export-patches STACK={up.stack} UP={up.name}`; discard them: `git -C {up.path} checkout -- .`",
        )
    commits = unexported_commits(up, base)
    if commits:
        listed = "\n    ".join(commits[:20])
        raise UserError(
            f"{up.tree} has commits that are not in patches/{up.stack}/{up.name}; will not {action}:\n    {listed}",
            fix=f"keep them: `make export-patches STACK={up.stack} UP={up.name}`; discard them: "
            f"`git -C {up.path} reset --hard {BASE_REF}`",
        )
