"""tools.stacks: the stacks, which one a command uses, and what an NPU node must have for each."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tools import stacks
from tools.errors import UserError


def test_the_two_stacks_and_their_default():
    every = stacks.load()
    assert set(every) == {"published", "current"}
    assert sum(s.default for s in every.values()) == 1
    assert every["published"].npu == {"cann": "8.2.RC1", "torch-npu": "2.5.1.post1", "torch": "2.5.1"}
    assert every["current"].npu["cann"] == "9.1.0" and every["current"].npu["torch-npu"] == "2.10.0.post4"


def test_which_stack_a_command_uses(monkeypatch, tmp_path):
    monkeypatch.delenv(stacks.ENV_VAR, raising=False)
    monkeypatch.setattr(stacks, "venv_stack", lambda prefix=None: None)
    assert stacks.resolve().default
    monkeypatch.setattr(stacks, "venv_stack", lambda prefix=None: "current")
    assert stacks.resolve().name == "current"  # the environment it runs in
    monkeypatch.setenv(stacks.ENV_VAR, "published")
    assert stacks.resolve().name == "published"  # the shell's choice beats the environment's
    assert stacks.resolve("current").name == "current"  # an explicit STACK= beats both
    monkeypatch.setenv(stacks.ENV_VAR, "nightly")
    with pytest.raises(UserError, match=r"unknown stack ASCEND_R1_STACK='nightly': the stacks are"):
        stacks.resolve()


def test_the_makefile_finds_each_stacks_environment():
    out = subprocess.run(
        [sys.executable, "-m", "tools.stacks", "venv", "--stack", "current", "--profile", "npu"],
        cwd=stacks.REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == ".venv-current-npu"
    bad = subprocess.run(
        [sys.executable, "-m", "tools.stacks", "venv", "--stack", "nope"],
        cwd=stacks.REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "unknown stack STACK='nope'" in bad.stderr and bad.stdout == ""


@pytest.mark.parametrize(
    ("node", "fits"),
    [
        (
            {"cann": "8.2.RC1", "torch-npu": "2.5.1.post1", "torch": "2.5.1", "triton-ascend": None},
            "published",
        ),
        (
            {"cann": "9.1.0", "torch-npu": "2.10.0.post4", "torch": "2.10.0", "triton-ascend": "3.2.2"},
            "current",
        ),
        ({"cann": "9.1.0", "torch-npu": "2.10.0.post4", "torch": "2.10.0", "triton-ascend": "3.2.0"}, None),
        ({"cann": None, "torch-npu": None, "torch": "2.13.0+cpu", "triton-ascend": None}, None),
    ],
)
def test_an_npu_node_is_matched_against_each_stack(node, fits):
    for stack in stacks.load().values():
        verdict = stacks.npu_fit(stack, node)
        if stack.name == fits:
            assert verdict is None
        else:
            assert verdict.startswith("this node has ")
            assert (
                f"stack {fits} fits this node: use STACK={fits}" if fits else "no stack fits this node"
            ) in verdict


def test_selfcheck_refuses_a_stack_the_node_does_not_fit(monkeypatch, capsys):
    from tools.selfcheck.__main__ import main

    monkeypatch.setattr(stacks, "resolve", lambda name=None, root=stacks.REPO: stacks.load()["current"])
    monkeypatch.setattr(
        stacks,
        "installed_npu_versions",
        lambda root=stacks.REPO: {"cann": "8.2.RC1", "torch-npu": "2.5.1.post1", "torch": "2.5.1"},
    )
    assert main(["--device", "npu"]) == 1
    err = capsys.readouterr().err
    assert "stack current needs 9.1.0" in err and "stack published fits this node: use STACK=published" in err


@pytest.fixture
def other_stack_only(tmp_path):
    """A checkout bootstrapped for one stack only: the Makefile, a copy of tools/ (its REPO is the copy),
    patches/, recipes/, third_party/, locks/, requirements/ and pyproject.toml linked, and one environment (this test's) under the name of a stack
    that is not the default; the default stack's environment is missing. (checkout, missing, present)"""
    import shutil

    repo = tmp_path / "clone"
    repo.mkdir()
    shutil.copy(stacks.REPO / "Makefile", repo / "Makefile")
    shutil.copytree(stacks.REPO / "tools", repo / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    # everything a checkout has that the commands read (locks/ and requirements/ too: a command that reads
    # a stack's lock, e.g. selfcheck's versions, must meet the real one, not a traceback)
    for name in ("patches", "recipes", "third_party", "locks", "requirements", "pyproject.toml"):
        (repo / name).symlink_to(stacks.REPO / name)
    missing = stacks.default().name
    present = next(name for name in stacks.load() if name != missing)
    (repo / stacks.venv_name(present, "cpu")).symlink_to(sys.prefix)
    return repo, missing, present


def _make(repo, *args):
    import os

    env = {k: v for k, v in os.environ.items() if k not in (stacks.ENV_VAR, "VENV", "MAKEFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "--no-print-directory", "-C", str(repo), *args, "PROFILE=cpu"],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip


def test_a_command_for_a_stack_that_is_not_bootstrapped_says_so_in_one_line(other_stack_only):
    """`make train` once said `run make bootstrap first` (which bootstraps the other stack), `make plan` and
    the others failed with the shell's `.venv-current-cpu/bin/python: No such file or directory` (127)."""
    repo, missing, present = other_stack_only
    for target in (
        ["train"],
        ["plan", "RECIPE=deepseek-v3-671b-a3"],
        ["recipes"],
        ["ray-stop"],
        ["selfcheck"],
    ):
        r = _make(repo, *target)
        assert r.returncode == 2, (target, r.stdout, r.stderr)
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (target, r.stderr)
        assert f"make {target[0]}: stack {missing} is not bootstrapped here" in errors[0], errors
        assert f"bootstrapped: {present} (.venv-{present}-cpu)" in errors[0], errors
        assert f"STACK={present}" in r.stderr and f"make bootstrap STACK={missing}" in r.stderr, r.stderr
        assert "No such file" not in r.stderr and "Traceback" not in r.stderr


def test_plan_of_the_recipe_alone_runs_on_any_stacks_environment(other_stack_only):
    """`make plan RECIPE=deepseek-v3-671b-a3 NO_ENV=1` checks the recipe alone: with only another stack's
    environment it plans the stack asked (the default here) with that environment's Python."""
    repo, missing, present = other_stack_only
    r = _make(repo, "plan", "RECIPE=deepseek-v3-671b-a3", "NO_ENV=1", "JSON=1")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr)
    import json

    plan = json.loads(r.stdout)
    assert plan["recipe"] == "deepseek-v3-671b-a3" and plan["ok"], [
        r for r in plan["rules"] if r["status"] == "FAIL"
    ]
    # planned for the stack asked, not the environment's: the server-mode rollout rule is the current stack's
    server_rule = "no VLLM_DP_SIZE with server-mode rollout" in {r["name"] for r in plan["rules"]}
    assert server_rule == (missing == "current"), (missing, present)
