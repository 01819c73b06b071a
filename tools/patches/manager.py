"""apply, unapply, export, status: the series as commits on top of each pristine base."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from tools import atomic
from tools.errors import UserError
from tools.patches import git as g
from tools.patches import sources, stamp
from tools.patches.config import Upstream
from tools.patches.series import ZERO, Patch, load_series, read_series, series_header
from tools.patches.tree import guard_user_work as guard_user_work
from tools.patches.tree import require_tree as require_tree
from tools.patches.tree import unexported_commits as unexported_commits

MADE_FOR = "# made-for:"
FORMAT_PATCH = (
    "format-patch",
    "-1",
    "--stdout",
    "--zero-commit",
    "--full-index",
    "--no-stat",
    "--no-signature",
    "--no-numbered",
    "--find-renames=50%",
    "--no-color",
    "--encoding=UTF-8",
    "--subject-prefix=PATCH",
)


def series_digest(up: Upstream, base: str) -> str:
    h = hashlib.sha256(base.encode())
    if up.series_file.exists():
        h.update(up.series_file.read_bytes())
    for name in read_series(up):
        path = up.patch_dir / name
        h.update(name.encode())
        h.update(path.read_bytes() if path.exists() else b"<missing>")
    return h.hexdigest()


def made_for(up: Upstream) -> str | None:
    for line in series_header(up):
        if line.startswith(MADE_FOR):
            return line[len(MADE_FOR) :].strip()
    return None


def blob_mismatches(tree: Path, patch: Patch) -> list[str]:
    """Files whose content at the tree's HEAD is not the patch's pre-image (from its `index` lines)."""
    problems = []
    for f in patch.files:
        if f.pre_blob is None:
            continue
        current = g.git(
            tree, "rev-parse", "--verify", "--quiet", f"HEAD:{f.old_path}", check=False
        ).stdout.strip()
        expected = None if f.pre_blob == ZERO else f.pre_blob
        if (current or None) != expected:
            problems.append(
                f"{f.old_path}: patch expects blob {f.pre_blob[:12]}, tree has "
                f"{current[:12] if current else 'no such file'}"
            )
    return problems


def failure_message(up: Upstream, tree: Path, patch: Patch, output: str) -> UserError:
    """Why `patch` did not apply to `tree` (at the state before it), and the command that fixes it."""
    blob_problems = blob_mismatches(tree, patch)
    already = (
        g.git(tree, "apply", "--check", "--reverse", str(patch.path.resolve()), check=False).returncode == 0
    )
    where = ""
    m = re.search(r"error: patch failed: (.+):(\d+)", output)
    if m:
        path, line = m.group(1), int(m.group(2))
        change = next((f for f in patch.files if f.old_path == path), None)
        hunk = (
            next((i + 1 for i, start in enumerate(change.hunks) if start == line), None) if change else None
        )
        where = f"\n  file {path}, hunk {hunk or '?'} (at line {line})"
    elif m := re.search(
        r"error: (.+): (does not exist in index|already exists in index|No such file)", output
    ):
        where = f"\n  file {m.group(1)}: {m.group(2)}"
    pin = up.pin
    made = made_for(up)
    git_says = "\n    ".join(line for line in output.strip().splitlines() if line.strip())[-1500:]
    head = f"{up.name}: {patch.name} does not apply{where}\n  made for: {made or 'unknown'}; pin: {pin}"
    if re.search(r"corrupt patch|Patch format detection failed|No valid patches|malformed", output):
        return UserError(
            f"{head}\n  broken patch: git cannot read it:\n    {git_says}",
            fix=f"restore it (`git checkout -- patches/{up.stack}/{up.name}/{patch.name}`) or re-create it: apply up to the "
            f"previous patch, commit the change in {up.path}, `make export-patches STACK={up.stack} UP={up.name}`",
        )
    if already:
        return UserError(
            f"{head}\n  already applied: the tree already contains this change",
            fix=f"drop {patch.name} from patches/{up.stack}/{up.name}/series (and delete the file); "
            f"`make rebase-upstream` reports such patches by itself",
        )
    if made and made != pin:
        return UserError(
            f"{head}\n  upstream changed since the patch was made (made for {made}, found {pin}):\n    {git_says}",
            fix=f"carry the series forward with a 3-way merge: `make rebase-upstream STACK={up.stack} UP={up.name} REF={up.tag}`",
        )
    if blob_problems:
        return UserError(
            f"{head}\n  the tree is not the pristine pin:\n    " + "\n    ".join(blob_problems),
            fix=f"re-fetch the sources: `make unapply-patches STACK={up.stack} UP={up.name}` then `make bootstrap STACK={up.stack}`",
        )
    return UserError(
        f"{head}\n  the patch does not match the pinned sources it claims to be made for:\n    {git_says}",
        fix=f"edit patches/{up.stack}/{up.name}/{patch.name}, or apply by hand with "
        f"`git -C {up.path} am --3way ../../../patches/{up.stack}/{up.name}/{patch.name}`, resolve, "
        f"then `make export-patches STACK={up.stack} UP={up.name}`",
    )


def am(tree: Path, patch: Path, *, three_way: bool = False) -> tuple[int, str]:
    args = ["am", "--committer-date-is-author-date", "--keep-non-patch", "--no-keep-cr"]
    args += ["--3way"] if three_way else ["--no-3way"]
    proc = g.git(tree, *args, str(patch.resolve()), check=False)
    return proc.returncode, proc.stdout + proc.stderr


def apply(up: Upstream, *, quiet: bool = False) -> str:
    """Apply the series on top of the pristine base; a no-op when the stamp matches."""
    base = require_tree(up)
    sources.protect_gitlink(up)
    st = stamp.read(up.tree)
    digest = series_digest(up, base)
    head = g.rev(up.tree, "HEAD")
    names = read_series(up)
    fresh = st.get("digest") == digest and head == st.get("head") and not st.get("applying")
    if fresh and not g.dirty_files(up.tree):
        return f"{up.name}: up to date ({len(names)} patches)"
    recovering = g.am_in_progress(up.tree) or st.get("applying")
    guard_user_work(up, action="apply patches")
    if g.am_in_progress(up.tree):
        g.git(up.tree, "am", "--abort", check=False)
    patches = load_series(up)  # parse first: a malformed file fails before the tree moves
    g.git(up.tree, "checkout", "-q", "-f", "-B", sources.BRANCH, base)
    stamp.write(up.tree, {"applying": True, "digest": None, "head": None})
    try:
        for patch in patches:
            code, output = am(up.tree, patch.path)
            if code != 0:
                g.git(up.tree, "am", "--abort", check=False)
                stamp.write(up.tree, {"applying": None})
                raise failure_message(up, up.tree, patch, output)
    except KeyboardInterrupt:
        g.git(up.tree, "am", "--abort", check=False)
        g.git(up.tree, "checkout", "-q", "-f", "-B", sources.BRANCH, base)
        stamp.write(up.tree, {"applying": None})
        raise UserError(
            f"{up.name}: interrupted; the tree is back at the pristine base",
            fix=f"run `make apply-patches STACK={up.stack} UP={up.name}` again",
        ) from None
    stamp.write(up.tree, {"applying": None, "digest": digest, "head": g.rev(up.tree, "HEAD")})
    made = made_for(up)
    note = ""
    if patches and made and made != up.pin:
        note = (
            f"\n  warning: applies, but the series was made for {made}, not the pin {up.pin}:"
            f" run `make export-patches STACK={up.stack} UP={up.name}` to record the pin"
        )
    again = " (recovered an interrupted apply)" if recovering else ""
    return f"{up.name}: applied {len(patches)} patches{again}{note}"


def unapply(up: Upstream) -> str:
    base = require_tree(up)
    guard_user_work(up, action="go back to the pristine sources")
    if g.am_in_progress(up.tree):
        g.git(up.tree, "am", "--abort", check=False)
    g.git(up.tree, "checkout", "-q", "-f", "-B", sources.BRANCH, base)
    stamp.write(up.tree, {"applying": None, "digest": None, "head": None})
    return f"{up.name}: pristine ({up.version})"


def format_commit(tree: Path, commit: str) -> tuple[str, bytes]:
    """(file name, bytes) of one commit as a patch mail, with flags fixed for byte-identical output."""
    name = g.out(tree, "log", "-1", "--format=%f", commit) + ".patch"
    data = g.git(tree, *FORMAT_PATCH, commit, text=False).stdout
    return name, data


def render_series(up: Upstream, names: list[str], pin: str) -> str:
    header = [line for line in series_header(up) if not line.startswith(MADE_FOR)]
    if not header:
        header = [f"# patches/{up.stack}/{up.name}: applied in this order on top of the pin (tools.patches)"]
    return "\n".join([*header, f"{MADE_FOR} {pin}", *names]) + "\n"


def export_commits(tree: Path, base: str, head: str = "HEAD") -> dict[str, bytes]:
    """The series (file name -> bytes, in order) that the commits base..head of `tree` make."""
    merges = g.out(tree, "rev-list", "--merges", f"{base}..{head}")
    if merges:
        raise UserError(
            f"{tree}: merge commits on top of the base cannot be exported",
            fix=f"rebase them into a linear history: `git -C {tree} rebase {sources.BASE_REF}`",
        )
    commits = g.out(tree, "rev-list", "--reverse", f"{base}..{head}").split()
    out: dict[str, bytes] = {}
    for commit in commits:
        name, data = format_commit(tree, commit)
        stem, n = name[: -len(".patch")], 2
        while name in out:
            name, n = f"{stem}-{n}.patch", n + 1
        out[name] = data
    return out


def export(up: Upstream, pin: str | None = None) -> str:
    base = require_tree(up)
    if g.am_in_progress(up.tree):
        raise UserError(
            f"{up.tree}: a `git am` is in progress", fix=f"finish it: git -C {up.path} am --continue"
        )
    dirty = g.dirty_files(up.tree)
    if dirty:
        raise UserError(
            f"{up.tree} has uncommitted edits: " + ", ".join(dirty[:10]),
            fix=f"commit them first: `git -C {up.path} commit -am '{up.name}: <area>: <summary>'`",
        )
    patches = export_commits(up.tree, base)
    old = set(read_series(up))
    up.patch_dir.mkdir(parents=True, exist_ok=True)
    for name, data in patches.items():
        path = up.patch_dir / name
        if not path.exists() or path.read_bytes() != data:
            atomic.write_bytes(path, data)
    for name in old - set(patches):
        (up.patch_dir / name).unlink(missing_ok=True)  # tracked in git: recoverable
    atomic.write_bytes(up.series_file, render_series(up, list(patches), pin or up.pin).encode())
    stamp.write(
        up.tree, {"digest": series_digest(up, base), "head": g.rev(up.tree, "HEAD"), "applying": None}
    )
    return f"{up.name}: exported {len(patches)} patches to patches/{up.stack}/{up.name}"


class State(StrEnum):
    """Where a tree stands with its series (`PatchStatus.state`)."""

    MISSING = "missing"  # no sources, or no pristine base recorded
    APPLIED = "applied"  # the whole series, as the manager applied it, and nothing else
    PRISTINE = "pristine"  # the pin, nothing on top
    INTERRUPTED = "interrupted"  # an apply of ours was cut off
    UNEXPORTED = "unexported"  # commits on top that the series does not hold
    STALE = "stale"  # the series changed since it was applied


@dataclass(frozen=True)
class PatchStatus:
    """A tree's standing, for callers to read (`ready`, `applied`, `total`); `row()` is its display."""

    upstream: str
    pin: str
    state: State
    source: str | None = None  # git | pypi | ... (the stamp's record); None without sources
    dirty: bool | None = None  # uncommitted edits in the tree; None without sources
    base: str | None = None  # the pristine base commit
    head: str | None = None
    applied: int = 0  # patches of the series in the tree (all of them only when state is APPLIED)
    total: int = 0  # patches in the series
    on_top: int = 0  # commits between the base and HEAD

    @property
    def ready(self) -> bool:
        """The whole series is applied as recorded (what a run needs)."""
        return self.state is State.APPLIED

    def patches_text(self) -> str:
        return {
            State.MISSING: "-",
            State.APPLIED: f"{self.applied}/{self.total} applied",
            State.PRISTINE: f"0/{self.total} (pristine)",
            State.INTERRUPTED: "interrupted apply (run make apply-patches)",
            State.UNEXPORTED: f"{self.on_top} commits, not exported (make export-patches)",
            State.STALE: "stale: series changed (make apply-patches)",
        }[self.state]

    def row(self) -> dict[str, str]:
        """The display of `make status`: one column each."""
        tree = "-" if self.dirty is None else ("dirty" if self.dirty else "clean")
        return {
            "upstream": self.upstream,
            "pin": self.pin,
            "source": self.source or "missing",
            "tree": tree,
            "patches": self.patches_text(),
        }


def patch_status(up: Upstream) -> PatchStatus:
    """Where `up`'s tree stands with its series."""
    base = g.rev(up.tree, sources.BASE_REF) if g.is_repo(up.tree) else None
    if base is None:
        return PatchStatus(up.name, up.version, State.MISSING)
    st = stamp.read(up.tree)
    head = g.rev(up.tree, "HEAD")
    total = len(read_series(up))
    on_top = int(g.out(up.tree, "rev-list", "--count", f"{base}..HEAD") or 0)
    applied = 0
    if st.get("applying"):
        state = State.INTERRUPTED
    elif st.get("head") == head and st.get("digest") == series_digest(up, base):
        state, applied = State.APPLIED, total
    elif on_top == 0:
        state = State.PRISTINE
    elif unexported_commits(up, base):
        state = State.UNEXPORTED
    else:
        state = State.STALE
    return PatchStatus(
        up.name, up.version, state, source=st.get("source", "?"), dirty=bool(g.dirty_files(up.tree)),
        base=base, head=head, applied=applied, total=total, on_top=on_top,
    )  # fmt: skip


def status(up: Upstream) -> dict[str, str]:
    """`make status`'s row for `up` (display text: callers that decide read `patch_status`)."""
    return patch_status(up).row()
