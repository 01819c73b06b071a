"""`check` (what CI runs): the series against fresh pristine trees, strictly, and byte-identical re-export."""

from __future__ import annotations

import difflib
import tempfile
from pathlib import Path

from tools.errors import UserError
from tools.patches import git as g
from tools.patches import manager, sources, table
from tools.patches.config import REPO, Upstream
from tools.patches.series import lint, load_series, read_series

REFRESHED = Path("build") / "patches-refreshed.diff"


def _diff(rel: str, old: bytes | None, new: bytes | None) -> str:
    a = old.decode(errors="replace").splitlines(keepends=True) if old is not None else []
    b = new.decode(errors="replace").splitlines(keepends=True) if new is not None else []
    return "".join(
        difflib.unified_diff(
            a, b, "/dev/null" if old is None else f"a/{rel}", "/dev/null" if new is None else f"b/{rel}"
        )
    )


def check_one(up: Upstream, all_series: dict[str, list[str]]) -> tuple[list[str], str]:
    """Problems, and a diff that refreshes the patch files (empty when they are exact)."""
    problems = lint(up, all_series)
    if problems:
        return problems, ""
    names = read_series(up)
    if not names:
        return [], ""
    base = manager.require_tree(up)
    if not sources.pristine_ok(up):
        return [
            f"{up.tree}: the pristine sources are not those of the pin {up.version}; run `make bootstrap STACK={up.stack}`"
        ], ""
    with tempfile.TemporaryDirectory(prefix=f"check-{up.name}-") as tmp:
        fresh = Path(tmp) / "tree"
        g.git(REPO, "clone", "-q", "--shared", "--no-checkout", str(up.tree), str(fresh))
        g.git(fresh, "checkout", "-q", "-b", "check", base)
        for patch in load_series(up):
            blob_problems = manager.blob_mismatches(fresh, patch)
            if blob_problems:
                problems += [f"{patch.path}: pre-image differs from the tree: {p}" for p in blob_problems]
            code, output = manager.am(fresh, patch.path)
            if code != 0:
                g.git(fresh, "am", "--abort", check=False)
                problems.append(str(manager.failure_message(up, fresh, patch, output)))
                return problems, ""
        refreshed = manager.export_commits(fresh, base)
    diffs = []
    for name in sorted(set(names) | set(refreshed)):
        path = up.patch_dir / name
        old = path.read_bytes() if path.exists() and name in names else None
        new = refreshed.get(name)
        if old != new:
            problems.append(f"{path}: re-export differs from the file (not byte-identical)")
            diffs.append(_diff(f"patches/{up.stack}/{up.name}/{name}", old, new))
    series_new = manager.render_series(up, list(refreshed), up.pin).encode()
    series_old = up.series_file.read_bytes()
    if series_new != series_old:
        problems.append(
            f"{up.series_file}: differs from a re-export (made-for line or order; "
            f"made for {manager.made_for(up) or 'unknown: no # made-for line'}, pin {up.pin})"
        )
        diffs.append(_diff(f"patches/{up.stack}/{up.name}/series", series_old, series_new))
    return problems, "".join(diffs)


def check(chosen: dict[str, list[Upstream]], every: dict[str, list[Upstream]]) -> list[str]:
    """chosen, every: stack -> upstreams (what to check; all of each stack, for Requires: and the table)."""
    problems, diffs = [], []
    for stack, upstreams in chosen.items():
        all_series = {u.name: read_series(u) for u in every[stack]}
        for up in upstreams:
            p, d = check_one(up, all_series)
            problems += p
            if d:
                diffs.append(d)
    if not table.is_fresh(every):
        problems.append(f"{table.DOC}: the patch table is stale: run `python3 -m tools.patches table`")
        path = REPO / table.DOC
        old = path.read_bytes() if path.exists() else None
        diffs.append(_diff(table.DOC.as_posix(), old, table.updated_doc(every).encode()))
    out = REPO / REFRESHED
    if diffs:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(diffs))
        problems.append(f"refreshed files written to {REFRESHED}: review, then `git apply {REFRESHED}`")
    elif out.exists():
        out.unlink()
    return problems


def fail_if(problems: list[str]) -> None:
    if problems:
        raise UserError("patch check failed:\n  - " + "\n  - ".join(problems))
