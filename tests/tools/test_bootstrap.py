"""tools.bootstrap: profile detection, stacks, and MindSpeed without git access on each profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import bootstrap, stacks
from tools.errors import UserError, exit_status


def test_profile_detection(monkeypatch):
    monkeypatch.setattr(stacks.Path, "glob", lambda self, pattern: iter(()))
    monkeypatch.setattr(stacks.shutil, "which", lambda name: None)
    assert bootstrap.detect_profile() == "cpu"
    monkeypatch.setattr(stacks.shutil, "which", lambda name: "/usr/bin/x" if name == "nvidia-smi" else None)
    assert bootstrap.detect_profile() == "cuda"
    monkeypatch.setattr(stacks.shutil, "which", lambda name: "/usr/bin/x")
    assert bootstrap.detect_profile() == "npu"


def fake_sources(monkeypatch, failing: set[str]):
    def ensure(up, mode):
        if up.name in failing:
            raise UserError(f"{up.name}: no PyPI release and git cannot reach it")
        return f"{up.name}: sources present (pypi)"

    monkeypatch.setattr(bootstrap, "ensure_sources", ensure)


def test_cpu_profile_does_not_ask_for_mindspeed(monkeypatch, tmp_path, capsys):
    asked = []
    fake_sources(monkeypatch, {"mindspeed"})
    real = bootstrap.ensure_sources
    monkeypatch.setattr(bootstrap, "ensure_sources", lambda up, mode: asked.append(up.name) or real(up, mode))
    bootstrap.Bootstrap("cpu", tmp_path, "published").sources()
    assert "mindspeed" not in asked and {"verl", "megatron"} <= set(asked)
    assert "not needed by the cpu profile (nothing to install or check): " in capsys.readouterr().out


def test_npu_profile_stops_without_mindspeed(monkeypatch, tmp_path):
    fake_sources(monkeypatch, {"mindspeed"})
    with pytest.raises(UserError, match="NPU profile unavailable: MindSpeed needs git access or a mirror"):
        bootstrap.Bootstrap("npu", tmp_path, "published").sources()


def test_any_other_missing_source_stops_every_profile(monkeypatch, tmp_path):
    fake_sources(monkeypatch, {"verl"})
    with pytest.raises(UserError, match="sources for published/verl failed"):
        bootstrap.Bootstrap("cpu", tmp_path, "published").sources()


def test_an_environment_made_for_another_profile_or_stack_is_refused(tmp_path):
    b = bootstrap.Bootstrap("npu", tmp_path, "published")
    b.save(stack="published", profile="cpu", lock="x")
    with pytest.raises(UserError) as e:
        b.check()
    assert "made for stack published, profile cpu, not stack published, profile npu" in str(e.value)
    assert "(.venv-published-npu)" in str(e.value)
    bootstrap.Bootstrap("cpu", tmp_path, "published").check()  # the same stack and profile is fine
    b.save(stack="elsewhere")
    with pytest.raises(UserError, match="made for stack elsewhere, profile cpu"):
        bootstrap.Bootstrap("cpu", tmp_path, "published").check()


def test_an_environment_from_before_stacks_counts_as_published(tmp_path):
    bootstrap.Bootstrap("cpu", tmp_path, "published").save(profile="cpu", lock="x")  # no "stack" recorded
    bootstrap.Bootstrap("cpu", tmp_path, "published").check()


def test_unknown_stack_lists_the_stacks(monkeypatch):
    monkeypatch.delenv("ASCEND_R1_STACK", raising=False)
    with pytest.raises(UserError) as e:
        bootstrap.Bootstrap("cpu", Path("/nonexistent"), "nightly")
    assert "unknown stack STACK='nightly': the stacks are published, current (default)" in str(e.value)
    assert exit_status(bootstrap.main, ["--stack", "nightly", "--profile", "cpu"]) == 2
