"""Pristine upstream trees: from git (honouring mirrors and url.<base>.insteadOf) or from PyPI releases.

A tree is a git repository at the upstream's path. Its pristine commit is marked with the ref
`refs/ascend-r1/base`: the pin itself when it came from git, or a deterministic import of the verified
PyPI archive (fixed author and dates, so every machine gets the same commit id) when it did not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

from tools.env import index, pipconf, user_cache
from tools.errors import UserError
from tools.patches import git as g
from tools.patches import stamp
from tools.patches.config import REPO, Upstream
from tools.patches.tree import BASE_REF as BASE_REF
from tools.patches.tree import BRANCH as BRANCH
from tools.patches.tree import base as base
from tools.patches.tree import guard_user_work

PRISTINE_DATE = "2000-01-01T00:00:00+0000"
# files that sdist builders generate and that are not in the upstream's git tree
GENERATED = ("PKG-INFO",)


def protect_gitlink(up: Upstream) -> None:
    """Keep `git add -A` / `commit -a` in the superproject from moving the pin to the patched HEAD.

    `ignore = all` in .gitmodules hides the moved HEAD from `git status`, but `git add` still stages it;
    skip-worktree on the gitlink (a local index flag, set on every bootstrap and apply) stops that.
    """
    if not (up.root / ".git").exists():
        return
    listed = g.git(up.root, "ls-files", "-s", "--", up.path.as_posix(), check=False).stdout
    if listed.startswith("160000 "):
        g.git(up.root, "update-index", "--skip-worktree", "--", up.path.as_posix())


def source_mode() -> str:
    """'git', 'pypi' or 'auto': CI always uses PyPI without probing git; ASCEND_R1_SOURCES overrides."""
    mode = os.environ.get("ASCEND_R1_SOURCES", "").strip().lower()
    if mode:
        if mode not in ("git", "pypi", "auto"):
            raise UserError(f"ASCEND_R1_SOURCES={mode!r} is not one of git, pypi, auto")
        return mode
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return "pypi"
    return "auto"


def reachable(url: str, timeout: float = 20.0, cwd: Path = REPO) -> bool:
    """Can git reach `url` (after the user's insteadOf rewrites)? Fails fast when the name does not resolve."""
    try:
        proc = subprocess.run(
            ["git", "ls-remote", "--exit-code", url, "HEAD"],
            capture_output=True,
            timeout=timeout,
            env=g.git_env(),
            cwd=cwd,
        )
    except (subprocess.TimeoutExpired, OSError):
        return False
    return proc.returncode in (0, 2)  # 2: reachable, but no HEAD ref


def git_url(up: Upstream) -> str | None:
    """The first of the url and the mirrors that git can reach, or None."""
    for url in (up.url, *up.mirrors):
        if reachable(url, cwd=up.root):
            return url
    return None


sha256_file = index.sha256_file


def pristine_ok(up: Upstream) -> bool:
    """Does the tree hold a pristine base for the current pin?"""
    b = base(up.tree)
    if b is None:
        return False
    st = stamp.read(up.tree)
    if st.get("source") == "git":
        return b == up.commit
    return up.pypi is not None and st.get("archive_sha256") == up.pypi.sha256


def _empty_or_absent(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def _refuse_if_user_work(up: Upstream) -> None:
    """Before replacing a tree's base: refuse when it holds edits or commits that are not exported."""
    guard_user_work(up, action="replace the sources")


def from_git(up: Upstream, url: str) -> None:
    tree = up.tree
    if not g.is_repo(tree):
        if not _empty_or_absent(tree):
            raise UserError(
                f"{tree} exists and is not a git tree; will not overwrite it",
                fix="move it away, then run `make bootstrap`",
            )
        g.git(up.root, "config", f"submodule.{up.path.as_posix()}.url", url)
        g.git(up.root, "submodule", "update", "--init", "--", up.path.as_posix(), timeout=3600)
    elif g.rev(tree, up.commit) is None:
        _refuse_if_user_work(up)
        g.git(tree, "fetch", url, up.commit, timeout=3600)
    g.git(tree, "update-ref", BASE_REF, up.commit)
    g.git(tree, "checkout", "-q", "-B", BRANCH, up.commit)
    stamp.write(tree, {"source": "git", "url": url, "base": up.commit})


def source_cache() -> Path:
    """Where verified source archives are kept: $ASCEND_R1_SOURCE_CACHE, else the shared user cache."""
    override = os.environ.get("ASCEND_R1_SOURCE_CACHE")
    return Path(override) if override else user_cache("sources")


def download(up: Upstream, version: str | None = None, sha256: str | None = None) -> Path:
    """The PyPI source archive of `up` (the pinned release unless `version`), verified by sha256.

    Located on the indexes pip is configured with and downloaded as a plain file: nothing is built or
    imported (tools.env.index). Kept in `source_cache()` for the next run."""
    if up.pypi is None:
        raise UserError(
            f"{up.name} has no PyPI release", fix="it needs git access or a mirror in upstreams.toml"
        )
    version = version or up.pypi.version
    expected = sha256 or (up.pypi.sha256 if version == up.pypi.version else None)
    cache = source_cache()
    cache.mkdir(parents=True, exist_ok=True)
    want = (index.normalize(up.pypi.name), version)
    found = sorted(p for p in cache.iterdir() if index.sdist_of(p.name) == want)
    if found:
        archive = found[0]
    else:
        settings = pipconf.read()
        link = index.locate(up.pypi.name, version, expected, settings)
        archive = index.fetch(link, cache / link.filename, settings)
    if expected:
        index.verified(archive, expected, f"patches/upstreams.toml [{up.name}] pypi")
    return archive


def _extract(archive: Path, dest: Path) -> None:
    """Unpack an sdist (or wheel) with its top folder stripped; only regular files and folders."""
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest)
        return
    try:
        with tarfile.open(archive) as t:
            members = []
            for m in t.getmembers():
                parts = Path(m.name).parts
                if len(parts) < 2 or not (m.isfile() or m.isdir()):
                    continue
                m.name = str(Path(*parts[1:]))
                members.append(m)
            t.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise UserError(
            f"{archive}: cannot unpack: {e}", fix=f"delete {archive} and run `make bootstrap` again"
        ) from None


def _commit_stage(tree: Path, stage: Path, index: Path, message: str) -> str:
    """A parentless commit of the files in `stage` (fixed author and dates), with `index` as git's index."""
    env = {"GIT_INDEX_FILE": str(index), "GIT_WORK_TREE": str(stage), "GIT_DIR": str(g.gitdir(tree))}
    g.git(tree, "add", "-A", "-f", ".", env=env)
    tree_id = g.out_env(tree, env, "write-tree")
    dates = {
        "GIT_AUTHOR_DATE": PRISTINE_DATE,
        "GIT_COMMITTER_DATE": PRISTINE_DATE,
        "GIT_AUTHOR_NAME": g.TOOL_NAME,
        "GIT_AUTHOR_EMAIL": g.TOOL_EMAIL,
        "GIT_COMMITTER_NAME": g.TOOL_NAME,
        "GIT_COMMITTER_EMAIL": g.TOOL_EMAIL,
    }
    return g.git(tree, "commit-tree", tree_id, input=message, env=dates).stdout.strip()


def _drop_generated(stage: Path) -> None:
    for name in GENERATED:
        (stage / name).unlink(missing_ok=True)
    for egg in stage.glob("*.egg-info"):
        shutil.rmtree(egg)


def import_archive(up: Upstream, archive: Path, version: str) -> tuple[str, bool]:
    """Commit the archive's files as a pristine, parentless commit in the tree.

    Returns (commit, checked_out). A new tree is unpacked in place and committed from there (its index and
    files already are the commit: nothing is written twice); an existing one gets the commit built from a
    staging folder, so nothing in its work tree is touched until the caller checks the commit out."""
    tree = up.tree
    message = f"pristine {up.pypi.name} {version} (PyPI sdist)\n"
    if not g.is_repo(tree):
        if not _empty_or_absent(tree):
            raise UserError(
                f"{tree} exists and is not a git tree; will not overwrite it",
                fix="move it away, then run `make bootstrap`",
            )
        tree.mkdir(parents=True, exist_ok=True)
        try:
            _extract(archive, tree)
            _drop_generated(tree)
            g.git(tree, "init", "-q")
            commit = _commit_stage(tree, tree, g.gitdir(tree) / "index", message)
        except BaseException:
            shutil.rmtree(tree, ignore_errors=True)  # half a tree is no tree: the next run starts over
            raise
        g.git(tree, "update-ref", f"refs/heads/{BRANCH}", commit)
        g.git(tree, "symbolic-ref", "HEAD", f"refs/heads/{BRANCH}")
        return commit, True
    with tempfile.TemporaryDirectory(dir=source_cache()) as tmp:
        stage = Path(tmp) / "files"
        _extract(archive, stage)
        _drop_generated(stage)
        return _commit_stage(tree, stage, Path(tmp) / "index", message), False


def from_pypi(up: Upstream) -> None:
    tree = up.tree
    if g.is_repo(tree):
        _refuse_if_user_work(up)
    archive = download(up)
    commit, checked_out = import_archive(up, archive, up.pypi.version)
    g.git(tree, "update-ref", BASE_REF, commit)
    if not checked_out:
        g.git(tree, "checkout", "-q", "-f", "-B", BRANCH, commit)
    stamp.write(
        tree, {"source": "pypi", "archive": archive.name, "archive_sha256": up.pypi.sha256, "base": commit}
    )


def ensure(up: Upstream, mode: str) -> str:
    """Make sure the tree has pristine sources for the pin. Returns a one-line status."""
    protect_gitlink(up)
    if pristine_ok(up):
        return f"{up.name}: sources present ({stamp.read(up.tree).get('source')})"
    url = None
    if up.commit is None:
        mode = "pypi"  # no commit to check a git tree against: the verified release archive is the pin
    if mode in ("git", "auto"):
        url = git_url(up)
        if url is None and mode == "git":
            raise UserError(
                f"{up.name}: git cannot reach {up.url} or its mirrors",
                fix="add a mirror to upstreams.toml or `git config --global url.<mirror>.insteadOf "
                f"{up.url}`, or use ASCEND_R1_SOURCES=pypi",
            )
    if url is not None:
        from_git(up, url)
        return f"{up.name}: sources from git ({url})"
    if up.pypi is None:
        raise UserError(
            f"{up.name}: no PyPI release and git cannot reach it",
            fix=f"give git access to {up.url} (or a mirror: url.<mirror>.insteadOf)",
        )
    from_pypi(up)
    return f"{up.name}: sources from PyPI ({up.pypi.name}=={up.pypi.version}, sha256 verified)"
