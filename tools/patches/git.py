"""Running git with settings fixed, so that results do not depend on a user's ~/.gitconfig."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tools.errors import UserError

# Identity used for commits the tools make (pristine imports, applied patches). Patch authors are kept
# by `git am`; only the committer is ours, with the author's date, so applied commits are reproducible.
TOOL_NAME = "ascend-r1 patch manager"
TOOL_EMAIL = "patches@ascend-r1.invalid"
# Settings that change what format-patch / am produce; pinned here.
FIXED_CONFIG = (
    "core.abbrev=12",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "diff.algorithm=myers",
    "diff.renames=true",
    "diff.noprefix=false",
    "diff.mnemonicPrefix=false",
    "diff.suppressBlankEmpty=false",
    "format.signature=",
    "format.numbered=false",
    "format.coverLetter=false",
    "am.keepcr=false",
    "am.threeWay=false",
    "apply.whitespace=nowarn",
    "commit.gpgSign=false",
    "gc.auto=0",
    f"user.name={TOOL_NAME}",
    f"user.email={TOOL_EMAIL}",
)


# variables that would point git at another repository or identity than the one the tools mean
SCRUBBED = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR",
            "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_PREFIX", "GIT_NAMESPACE", "GIT_AUTHOR_NAME",
            "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL",
            "GIT_COMMITTER_DATE")  # fmt: skip


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    # the system and user configs stay in force (url.<base>.insteadOf mirrors live there), and so do
    # GIT_SSH_COMMAND, GIT_CONFIG_GLOBAL and proxies; what changes the bytes the tools produce is
    # overridden by FIXED_CONFIG on every call
    env.update({"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"})
    env.update(extra or {})
    return env


def git(
    tree: Path,
    *args: str,
    check: bool = True,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    text: bool = True,
) -> subprocess.CompletedProcess:
    cmd = ["git"]
    for c in FIXED_CONFIG:
        cmd += ["-c", c]
    cmd += list(args)
    proc = subprocess.run(
        cmd, cwd=tree, capture_output=True, text=text, input=input, env=git_env(env), timeout=timeout
    )
    if check and proc.returncode != 0:
        err = proc.stderr if text else proc.stderr.decode(errors="replace")
        raise UserError(f"git {' '.join(args[:3])} failed in {tree}:\n{err.strip()}")
    return proc


def out(tree: Path, *args: str) -> str:
    return git(tree, *args).stdout.strip()


def rev(tree: Path, ref: str) -> str | None:
    proc = git(tree, "rev-parse", "--verify", "--quiet", ref + "^{commit}", check=False)
    return proc.stdout.strip() or None


def is_repo(tree: Path) -> bool:
    return (tree / ".git").exists()


def dirty_files(tree: Path) -> list[str]:
    """Tracked files with local edits (untracked files are never touched by the tools, so they don't count)."""
    lines = git(tree, "status", "--porcelain", "--untracked-files=no").stdout.splitlines()
    return [line[3:] for line in lines if line.strip()]


def am_in_progress(tree: Path) -> bool:
    gitdir = Path(out(tree, "rev-parse", "--absolute-git-dir"))
    return (gitdir / "rebase-apply").exists()


def gitdir(tree: Path) -> Path:
    return Path(out(tree, "rev-parse", "--absolute-git-dir"))


def out_env(tree: Path, env: dict[str, str], *args: str) -> str:
    return git(tree, *args, env=env).stdout.strip()
