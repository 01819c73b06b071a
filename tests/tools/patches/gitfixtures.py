"""Real git repositories in temporary folders, for testing the patch manager."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tools.patches import git as g
from tools.patches import manager, sources, stamp
from tools.patches.config import Upstream, load_upstreams

TRAILERS = (
    "Upstream-Status: Pending\nPatch-Type: bugfix\nRemove-When: upstream fixes it\n"
    "Tested-By: tests/test_demo.py\n"
)


def sh(cwd: Path, *args: str) -> str:
    env = g.git_env(
        {
            "GIT_AUTHOR_NAME": "Dev",
            "GIT_AUTHOR_EMAIL": "dev@example.invalid",
            "GIT_COMMITTER_NAME": "Dev",
            "GIT_COMMITTER_EMAIL": "dev@example.invalid",
            "GIT_AUTHOR_DATE": "2026-01-02T03:04:05+0000",
            "GIT_COMMITTER_DATE": "2026-01-02T03:04:05+0000",
        }
    )
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


@dataclass
class Project:
    root: Path
    origin: Path
    v1: str

    def upstream(self) -> Upstream:
        return load_upstreams(self.root)["demo"]

    @property
    def tree(self) -> Path:
        return self.root / "third_party" / "demo"  # the default stack's trees: third_party/<upstream>

    def commit_in_tree(self, path: str, text: str, subject: str = "demo: core: change greeting") -> str:
        (self.tree / path).write_text(text)
        sh(self.tree, "add", path)
        sh(self.tree, "commit", "-q", "-m", f"{subject}\n\nWhy it is needed.\n\n{TRAILERS}")
        return sh(self.tree, "rev-parse", "HEAD")


STACK = "alpha"  # the demo project's one stack


def write_toml(root: Path, url: str, tag: str, commit: str, mirrors: tuple[str, ...] = ()) -> None:
    (root / "patches" / STACK).mkdir(parents=True, exist_ok=True)
    (root / "patches" / "stacks.toml").write_text(f'default = "{STACK}"\n[{STACK}]\ndescription = "demo"\n')
    listed = ", ".join(f'"{m}"' for m in mirrors)
    (root / "patches" / STACK / "upstreams.toml").write_text(
        f'[demo]\nurl = "{url}"\nmirrors = [{listed}]\ntag = "{tag}"\ncommit = "{commit}"\n'
    )


def origin_uri(tmp: Path) -> str:
    return (tmp / "origin").as_uri()


def make_origin(tmp: Path) -> tuple[Path, str]:
    """An upstream repository with hello.py and util.py, tagged v1; returns (path, v1 commit)."""
    origin = tmp / "origin"
    origin.mkdir()
    sh(origin, "init", "-q", "-b", "main")
    (origin / "hello.py").write_text("def greet():\n    return 'hello'\n\n\ndef other():\n    return 1\n")
    (origin / "util.py").write_text("X = 1\nY = 2\nZ = 3\n")
    sh(origin, "add", ".")
    sh(origin, "commit", "-q", "-m", "v1")
    sh(origin, "tag", "v1")
    return origin, sh(origin, "rev-parse", "HEAD")


def make_project(tmp: Path) -> Project:
    origin, v1 = make_origin(tmp)
    root = tmp / "project"
    root.mkdir()
    (root / "tests").mkdir()
    (root / "tests" / "test_demo.py").write_text("def test_demo():\n    assert True\n")
    sh(root, "init", "-q", "-b", "main")
    write_toml(root, origin.as_uri(), "v1", v1)
    tree = root / "third_party" / "demo"
    sh(root, "clone", "-q", origin.as_uri(), str(tree))
    g.git(tree, "update-ref", sources.BASE_REF, v1)
    g.git(tree, "checkout", "-q", "-B", sources.BRANCH, v1)
    stamp.write(tree, {"source": "git", "base": v1})
    sh(root, "update-index", "--add", "--cacheinfo", f"160000,{v1},third_party/demo")
    return Project(root, origin, v1)


def project_with_patch(tmp: Path) -> Project:
    p = make_project(tmp)
    p.commit_in_tree("hello.py", "def greet():\n    return 'hi'\n\n\ndef other():\n    return 1\n")
    p.commit_in_tree("util.py", "X = 1\nY = 20\nZ = 3\n", subject="demo: util: raise Y")
    manager.export(p.upstream())
    return p


def add_stack(p: Project, stack: str, tag: str, commit: str) -> Upstream:
    """A second stack in the demo project whose `demo` tree is the origin at `tag` (a git source)."""
    with open(p.root / "patches" / "stacks.toml", "a") as f:
        f.write(f'[{stack}]\ndescription = "demo {stack}"\n')
    (p.root / "patches" / stack).mkdir()
    (p.root / "patches" / stack / "upstreams.toml").write_text(
        f'[demo]\nurl = "{p.origin.as_uri()}"\ntag = "{tag}"\ncommit = "{commit}"\n'
    )
    tree = p.root / "third_party" / "stacks" / stack / "demo"  # not the default stack
    sh(p.root, "clone", "-q", p.origin.as_uri(), str(tree))
    g.git(tree, "update-ref", sources.BASE_REF, commit)
    g.git(tree, "checkout", "-q", "-B", sources.BRANCH, commit)
    stamp.write(tree, {"source": "git", "base": commit})
    return load_upstreams(p.root, stack)["demo"]
