"""One error path: every command line under tools/ ends through tools.errors.run_cli, and a user error
ends each of them alike: exit status 2 (errors.USER_ERROR), `error: <what>` on one line (then `  fix: <how>`
when there is one), no traceback."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tools import errors

REPO = Path(__file__).resolve().parents[2]
# entries still being reworked on another branch of the same change (the planner becomes a package)
PENDING: set[str] = set()
# processes the tools start themselves, not commands a user types
INTERNAL = {"tools/reward/worker.py"}  # the reward pool's grading worker: a socket, no user input


def entries() -> list[Path]:
    """The modules that run as a command: `python -m tools.x` (a __main__.py, or a module with a
    `if __name__ == "__main__":` block)."""
    found = []
    for path in sorted((REPO / "tools").rglob("*.py")):
        tree = ast.parse(path.read_text())
        guarded = any(
            isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'" for n in tree.body
        )
        if (path.name == "__main__.py" or guarded) and str(path.relative_to(REPO)) not in INTERNAL:
            found.append(path)
    return found


def _ends_through_run_cli(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    body = tree.body
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            body = node.body
    calls = [n for n in body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
    return bool(calls) and ast.unparse(calls[-1].value.func) == "run_cli"


def _hand_written_handlers(path: Path) -> list[int]:
    """Lines of `except` blocks that end a command themselves: in a `main` (or with sys.exit), they print
    `error:` and return a status instead of letting the error reach run_cli."""
    lines = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, ast.FunctionDef | ast.Module):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                text = ast.unparse(node)
                returns = any(isinstance(n, ast.Return) for n in node.body)
                in_main = isinstance(fn, ast.FunctionDef) and fn.name == "main"
                if "error: " in text and ((in_main and returns) or "sys.exit" in text):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_every_command_line_ends_through_run_cli():
    bad = [
        str(p.relative_to(REPO))
        for p in entries()
        if str(p.relative_to(REPO)) not in PENDING and not _ends_through_run_cli(p)
    ]
    assert bad == [], f"these entries do not end with run_cli(main): {bad}"
    handlers = {
        str(p.relative_to(REPO)): _hand_written_handlers(p)
        for p in (REPO / "tools").rglob("*.py")
        if p.name != "errors.py" and str(p.relative_to(REPO)) not in PENDING
    }
    assert {k: v for k, v in handlers.items() if v} == {}, "hand-written error exits (let run_cli do it)"


def _one_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr, stderr
    assert lines and lines[0].startswith("error: "), stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  fix: ")), stderr
    return lines[0]


UNKNOWN_STACK = "error: unknown stack STACK='nope'"


@pytest.mark.parametrize(
    ("argv", "first_line"),
    [
        (["tools.bootstrap", "--stack", "nope", "--profile", "cpu"], UNKNOWN_STACK),
        (["tools.stacks", "venv", "--stack", "nope"], UNKNOWN_STACK),
        (["tools.patches", "status", "--stack", "nope"], UNKNOWN_STACK),
        (["tools.suite", "test", "--stack", "nope"], UNKNOWN_STACK),
        (["tools.upstream_tests", "--stack", "nope"], UNKNOWN_STACK),
        (["tools.env", "lock", "nope"], "error: unknown lock 'nope'"),
    ],
)
def test_the_standard_library_commands_exit_2_with_one_error(argv, first_line):
    """These run with the system python3 before any environment exists: as their own processes."""
    proc = subprocess.run(
        [sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == errors.USER_ERROR, proc.stderr
    assert _one_error(proc.stderr).startswith(first_line)


NO_RECIPE = "error: no recipe 'nope' in "


@pytest.mark.parametrize(
    ("module", "argv", "first_line"),
    [
        ("tools.launch.__main__", ["dry-run", "nope"], NO_RECIPE),
        ("tools.launch.__main__", ["plan", "nope"], NO_RECIPE),
        ("tools.cluster.ray_job", ["--recipe", "nope", "--address", "10.0.0.1:6766"], NO_RECIPE),
        ("tools.miniature.assets", ["nope"], NO_RECIPE),
        ("tools.launch.train", ["--recipe", "nope"], NO_RECIPE),
        # the one command line (make train, make ray-job, make tiny-assets): the same errors
        ("tools.launch.__main__", ["train", "--recipe", "nope"], NO_RECIPE),
        (
            "tools.launch.__main__",
            ["cluster", "job", "--recipe", "nope", "--address", "10.0.0.1:6766"],
            NO_RECIPE,
        ),
        ("tools.launch.__main__", ["assets", "nope"], NO_RECIPE),
        ("tools.weights.__main__", ["fix-config", "/nonexistent"], "error: /nonexistent: no config.json"),
        (
            "tools.data.cli",
            ["convert", "/nonexistent.jsonl", "/nonexistent-out"],
            "error: /nonexistent.jsonl",
        ),
    ],
)
def test_the_environment_commands_exit_2_with_one_error(capsys, module, argv, first_line):
    """Run in this process through the same path as their entry (errors.exit_status: run_cli's status)."""
    main = importlib.import_module(module).main
    assert errors.exit_status(main, argv) == errors.USER_ERROR
    assert _one_error(capsys.readouterr().err).startswith(first_line)


def test_run_cli_exits_with_the_status_and_leaves_bugs_their_traceback(capsys):
    def user_error() -> int:
        raise errors.UserError("the thing is wrong", fix="do this")

    with pytest.raises(SystemExit) as e:
        errors.run_cli(user_error)
    assert e.value.code == 2 and capsys.readouterr().err == "error: the thing is wrong\n  fix: do this\n"
    with pytest.raises(SystemExit) as e:
        errors.run_cli(lambda: 1)
    assert e.value.code == 1
    with pytest.raises(SystemExit) as e:
        errors.run_cli(lambda: None)
    assert e.value.code == 0

    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        errors.run_cli(interrupted)
    assert e.value.code == 130 and capsys.readouterr().err == "interrupted\n"
    with pytest.raises(ZeroDivisionError):  # a bug is not caught: Python prints its traceback
        errors.run_cli(lambda: 1 // 0)
