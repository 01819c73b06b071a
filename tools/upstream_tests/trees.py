"""The two trees a check runs on, and the upstream repository's files that the release archive lacks.

pristine: a scratch clone of the upstream's tree at its base (`refs/ascend-r1/base`: the pin);
patched:  the same with the stack's series applied (`git am`, strictly, as `make check-patches` does).
Both are built from the patch files, never from the working tree under third_party/, so local edits
there change nothing.

The repository: where a check needs files the release archive does not ship (verl's tests/special_sanity,
megatron's tests/), the upstream repository is fetched by git at the pinned commit, content-addressed
(the commit id fixes every byte), from the url or a mirror of upstreams.toml, with the user's
url.<base>.insteadOf rewrites honoured (tools/patches/sources.py), into a cache shared by checkouts;
its files missing from the archive are added to both trees. Without git access, or with no pinned
commit, `repository()` says why, and the checks that need it are reported as skipped. CI fetches it too
(CI=true takes the sources from the release archives only, but the tests may come from git): the commit
id fixes the files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from tools.errors import UserError
from tools.patches import git as g
from tools.patches import manager, sources
from tools.patches.config import Upstream
from tools.patches.series import load_series


@dataclass
class Trees:
    pristine: Path
    patched: Path
    identical: bool  # the series changes nothing (or is empty): pristine results equal patched ones
    changed: list[str] = field(default_factory=list)  # files the series adds or modifies
    deleted: list[str] = field(default_factory=list)  # files the series deletes
    patches: int = 0


def build(up: Upstream, work: Path) -> Trees:
    """Scratch clones of the pristine pin and of the pin with the series applied, under `work`."""
    base = manager.require_tree(up)
    sides = {}
    for side in ("pristine", "patched"):
        dest = work / side
        if dest.exists():
            shutil.rmtree(dest)
        g.git(up.tree.parent, "clone", "-q", "--shared", "--no-checkout", str(up.tree), str(dest))
        g.git(dest, "checkout", "-q", "-f", "-B", f"upstream-tests-{side}", base)
        sides[side] = dest
    series = load_series(up)
    for patch in series:
        code, output = manager.am(sides["patched"], patch.path)
        if code != 0:
            g.git(sides["patched"], "am", "--abort", check=False)
            raise UserError(
                f"{up.ref}: {patch.name} does not apply to the pin:\n{output.strip()[-800:]}",
                fix=f"run `make check-patches STACK={up.stack} UP={up.name}`",
            )
    status = g.out(sides["patched"], "diff", "--name-status", "--no-renames", base, "HEAD").splitlines()
    changed = [line.split("\t", 1)[1] for line in status if line[:1] in "AM"]
    deleted = [line.split("\t", 1)[1] for line in status if line[:1] == "D"]
    identical = g.out(sides["patched"], "rev-parse", "HEAD^{tree}") == g.out(
        sides["pristine"], "rev-parse", "HEAD^{tree}"
    )
    return Trees(sides["pristine"], sides["patched"], identical, changed, deleted, len(series))


def missing(tree: Path, needs: tuple[str, ...]) -> list[str]:
    """The `needs` paths absent from a tree."""
    return [n for n in needs if not (tree / n).exists()]


def _cache_dir(url: str) -> Path:
    """Beside the source archives (ASCEND_R1_SOURCE_CACHE moves both), one bare repository per url."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[-1]).strip("_")
    return sources.source_cache() / "repositories" / (name if name.endswith(".git") else name + ".git")


def _has_commit(repo: Path, commit: str) -> bool:
    return (repo / "HEAD").exists() and g.git(
        repo, "cat-file", "-e", f"{commit}^{{commit}}", check=False
    ).returncode == 0


@dataclass
class Repository:
    path: Path | None  # a git directory holding the pinned commit, or None
    note: str  # where it came from, or why there is none


def repository(up: Upstream, commit: str | None = None) -> Repository:
    """The upstream repository at the pinned commit, or at `commit` (cached), or why it cannot be had."""
    commit = commit or up.commit
    if commit is None:
        return Repository(None, f"the pin has no commit id ({up.commit_unknown})")
    # CI too (sources from the release archives only): the commit id fixes every byte of the test files, so
    # a cache cannot change what runs; where git cannot reach the repository, the checks are skipped
    mode = sources.source_mode()
    cache = _cache_dir(up.url)
    if _has_commit(cache, commit):
        return Repository(cache, f"repository at {commit[:12]} (cached in {cache})")
    url = sources.git_url(up)
    if url is None:
        where = f"{up.url}" + (f" or its mirrors ({', '.join(up.mirrors)})" if up.mirrors else "")
        if mode == "git":
            raise UserError(
                f"{up.ref}: git cannot reach {where} for the repository's tests",
                fix=f"add a mirror to patches/{up.stack}/upstreams.toml or `git config --global "
                f"url.<mirror>.insteadOf {up.url}`",
            )
        return Repository(None, f"git cannot reach {where}")
    if not (cache / "HEAD").exists():
        cache.mkdir(parents=True, exist_ok=True)
        g.git(cache, "init", "-q", "--bare")
    # shallow first (a commit id is fetchable by itself from GitHub and from git >= 2.5 servers)
    for depth in (["--depth", "1"], []):
        proc = g.git(cache, "fetch", "-q", "--no-tags", *depth, url, commit, check=False, timeout=3600)
        if proc.returncode == 0 and _has_commit(cache, commit):
            break
    if not _has_commit(cache, commit):
        return Repository(None, f"git could not fetch {commit} from {url}: {proc.stderr.strip()[-300:]}")
    # keep it: a ref makes gc keep the objects
    g.git(cache, "update-ref", f"refs/pins/{commit}", commit)
    return Repository(cache, f"repository at {commit[:12]} fetched from {url}")


def add_repository_files(tree: Path, repo: Path, commit: str, only: list[str] | None = None) -> int:
    """Check out into `tree` every file of the repository at `commit` that the tree lacks (with `only`: under
    those paths only). Returns the count."""
    alternates = Path(g.out(tree, "rev-parse", "--git-path", "objects/info/alternates"))
    if not alternates.is_absolute():
        alternates = tree / alternates
    objects = str(repo / "objects")
    have = alternates.read_text().splitlines() if alternates.exists() else []
    if objects not in have:
        alternates.write_text("\n".join([*have, objects]) + "\n")
    listing = g.git(tree, "ls-tree", "-r", "-z", commit).stdout.split("\0")
    wanted = []
    for entry in filter(None, listing):
        meta, name = entry.split("\t", 1)
        mode = meta.split()[0]
        if mode == "160000":  # a submodule: not part of this repository's files
            continue
        if only is not None and not any(name == o or name.startswith(o.rstrip("/") + "/") for o in only):
            continue
        if not os.path.lexists(tree / name):
            wanted.append(name)
    if wanted:
        g.git(tree, "--literal-pathspecs", "checkout", commit, "--pathspec-from-file=-", "--pathspec-file-nul",
              input="\0".join(wanted))  # fmt: skip
    return len(wanted)


def apply_harness(tree: Path, patches: tuple[Path, ...]) -> None:
    """Apply the checks' own harness patches (e.g. the project's header added to a license check's list)."""
    for patch in patches:
        proc = g.git(tree, "apply", "--whitespace=nowarn", str(patch), check=False)
        if proc.returncode != 0:
            raise UserError(
                f"{patch}: does not apply to {tree.name}: {proc.stderr.strip()[-400:]}",
                fix="re-make the harness patch against the check at the pinned commit",
            )


def expand(args: tuple[str, ...], tree: Path, changed: list[str]) -> list[str] | None:
    """A script's arguments with `{changed:<glob>}` expanded to the series' changed files present in
    `tree` that match. None when a placeholder matched no file on this side."""
    out, empty = [], False
    for a in args:
        m = re.fullmatch(r"\{changed:([^}]+)\}", a)
        if not m:
            out.append(a)
            continue
        files = [f for f in changed if fnmatch(f, m.group(1)) and (tree / f).is_file()]
        empty = empty or not files
        out += files
    return None if empty else out


def installed_package(python: Path, package: str) -> Path:
    """Where the environment's own build of `package` is installed (outside any tree)."""
    proc = subprocess.run(
        [str(python), "-I", "-c", f"import importlib.util as u; print(u.find_spec({package!r}).submodule_search_locations[0])"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise UserError(
            f"{python}: cannot find the installed {package}: {proc.stderr.strip()[-300:]}",
            fix="run `make bootstrap` for this stack",
        )
    return Path(proc.stdout.strip())


def use_installed(
    tree: Path, installed: Path, package: str, series_files: list[str], deleted: list[str]
) -> None:
    """Make `tree/<package>` the installed build (a farm of links to it) with this side's version of every
    file the series touches written in as a real file: tests then import the binary build (its compiled
    parts) with exactly the pristine or the patched Python files. The tree's own source folder moves
    aside to `<package>.source`; nothing is ever written through a link into the environment."""
    src = tree / package
    if src.exists():
        src.rename(tree / f"{package}.source")
    subprocess.run(["cp", "-as", str(installed), str(src)], check=True)
    for rel in [*series_files, *deleted]:
        if not rel.startswith(package + "/"):
            continue
        target = tree / rel
        if os.path.lexists(target):
            target.unlink()
        side_copy = tree / f"{package}.source" / rel[len(package) + 1 :]
        if side_copy.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(side_copy, target)
