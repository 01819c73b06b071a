"""tools.bootstrap: profile detection, and MindSpeed without git access on each profile."""

from __future__ import annotations

import subprocess

import pytest

from tools import bootstrap
from tools.errors import UserError


def test_profile_detection(monkeypatch):
    monkeypatch.setattr(bootstrap.Path, "glob", lambda self, pattern: iter(()))
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: None)
    assert bootstrap.detect_profile() == "cpu"
    monkeypatch.setattr(
        bootstrap.shutil, "which", lambda name: "/usr/bin/x" if name == "nvidia-smi" else None
    )
    assert bootstrap.detect_profile() == "cuda"
    monkeypatch.setattr(bootstrap.shutil, "which", lambda name: "/usr/bin/x")
    assert bootstrap.detect_profile() == "npu"


def fake_sources(monkeypatch, failing: set[str]):
    def run(cmd, **kwargs):
        name = cmd[-1]
        if name in failing:
            return subprocess.CompletedProcess(
                cmd, 1, "", f"error: {name}: no PyPI release and git cannot reach it"
            )
        return subprocess.CompletedProcess(cmd, 0, f"{name}: sources present (pypi)", "")

    monkeypatch.setattr(bootstrap.subprocess, "run", run)


def test_cpu_profile_goes_on_without_mindspeed(monkeypatch, tmp_path, capsys):
    fake_sources(monkeypatch, {"mindspeed"})
    bootstrap.Bootstrap("cpu", tmp_path).sources()
    assert bootstrap.MINDSPEED_UNAVAILABLE in capsys.readouterr().out


def test_npu_profile_stops_without_mindspeed(monkeypatch, tmp_path):
    fake_sources(monkeypatch, {"mindspeed"})
    with pytest.raises(UserError, match="NPU profile unavailable: MindSpeed needs git access or a mirror"):
        bootstrap.Bootstrap("npu", tmp_path).sources()


def test_any_other_missing_source_stops_every_profile(monkeypatch, tmp_path):
    fake_sources(monkeypatch, {"verl"})
    with pytest.raises(UserError, match="sources for verl failed"):
        bootstrap.Bootstrap("cpu", tmp_path).sources()


def test_requirements_digest_follows_the_files(tmp_path):
    a = tmp_path / "requirements.txt"
    a.write_text("numpy<2\n")
    first = bootstrap.digest([a], "cpu")
    assert bootstrap.digest([a], "cpu") == first and bootstrap.digest([a], "npu") != first
    a.write_text("numpy<3\n")
    assert bootstrap.digest([a], "cpu") != first
