"""tools.bootstrap: profile detection, and MindSpeed without git access on each profile."""

from __future__ import annotations

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
    def ensure(up, mode):
        if up.name in failing:
            raise UserError(f"{up.name}: no PyPI release and git cannot reach it")
        return f"{up.name}: sources present (pypi)"

    monkeypatch.setattr(bootstrap, "ensure_sources", ensure)


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


def test_an_environment_made_for_another_profile_is_refused(tmp_path):
    b = bootstrap.Bootstrap("npu", tmp_path)
    b.save(profile="cpu", lock="x")
    with pytest.raises(UserError) as e:
        b.check()
    assert "made for the cpu profile, not npu" in str(e.value) and "VENV=.venv-npu" in str(e.value)
    bootstrap.Bootstrap("cpu", tmp_path).check()  # the same profile is fine
