"""requirements.txt at the root: the default stack's NPU needs at exactly its lock's versions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.env import requirements as R
from tools.errors import UserError

REPO = Path(__file__).resolve().parents[3]


def test_the_committed_file_agrees_with_the_default_stacks_npu_lock():
    assert R.check(REPO) == []
    text = (REPO / "requirements.txt").read_text()
    stack = R.st.default(REPO).name
    lock = R.locked(REPO / "locks" / stack / "npu.txt")
    pins = {R.normalize(line.split("==")[0].split("[")[0]): line.split("==")[1] for line in text.splitlines()
            if line and not line.startswith("#")}  # fmt: skip
    for name in ("torch", "torch-npu", "ray", "transformers", "safetensors", "hydra-core", "mathruler"):
        assert pins[name] == lock[name], name
    assert "apex" not in pins


def _project(tmp_path: Path, npu: str, lock: str) -> Path:
    (tmp_path / "patches").mkdir(parents=True)
    shutil.copy(REPO / "patches" / "stacks.toml", tmp_path / "patches" / "stacks.toml")
    stack = R.st.default(tmp_path).name
    (tmp_path / "requirements" / stack).mkdir(parents=True)
    (tmp_path / "requirements" / stack / "base.txt").write_text(
        "ray[default]>=2.41  # the cluster\nmathruler==0.1.0\n"
    )
    (tmp_path / "requirements" / stack / "npu.txt").write_text("-r base.txt\n" + npu)
    (tmp_path / "locks" / stack).mkdir(parents=True)
    (tmp_path / "locks" / stack / "npu.txt").write_text(lock)
    return tmp_path


LOCK = "mathruler==0.1.0 \\\n    --hash=sha256:00\nray==2.60.0 \\\n    --hash=sha256:11\ntorch-npu==2.10.0.post4 \\\n"


def test_a_version_that_moves_in_the_lock_is_named_until_the_file_is_made_again(tmp_path):
    root = _project(tmp_path, "torch_npu==2.10.0.post4\n", LOCK)
    assert R.check(root) == [f"requirements.txt is missing; {R.FIX}"]
    R.write(root)
    text = (root / "requirements.txt").read_text()
    assert "ray[default]==2.60.0\nmathruler==0.1.0\ntorch_npu==2.10.0.post4\n" in text
    assert R.check(root) == []
    stack = R.st.default(root).name
    (root / "locks" / stack / "npu.txt").write_text(LOCK.replace("ray==2.60.0", "ray==2.61.0"))
    (problem,) = R.check(root)
    assert "ray 2.60.0 (lock: 2.61.0)" in problem and "python3 -m tools.env requirements" in problem


def test_plain_apex_and_unlocked_names_are_refused(tmp_path):
    with pytest.raises(UserError, match="apex"):
        R.render(_project(tmp_path / "a", "apex\n", LOCK))
    with pytest.raises(UserError, match="has no version of pyyaml"):
        R.render(_project(tmp_path / "b", "pyyaml\n", LOCK))
