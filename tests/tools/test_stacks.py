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
