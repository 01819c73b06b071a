"""The checkpoint folder is the same storage on every node (tools/launch/shared_storage.py): a node that
cannot read the driver's marker, or reads another one, stops the run before verl with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.launch import shared_storage as S
from tools.launch.run import TrainError


def test_a_folder_every_node_reads_passes_and_leaves_no_marker(tmp_path: Path) -> None:
    def shared(marker: Path) -> dict[str, str | None]:
        return {ip: marker.read_text() for ip in ("10.0.0.1", "10.0.0.2")}

    S.check(tmp_path / "ckpt", 2, shared)
    assert not (tmp_path / "ckpt" / S.MARKER).exists()


def test_a_node_with_its_own_disk_is_named_with_the_fix(tmp_path: Path) -> None:
    def local_disk(marker: Path) -> dict[str, str | None]:
        return {"10.0.0.1": marker.read_text(), "10.0.0.2": None, "10.0.0.3": "an old token"}

    with pytest.raises(TrainError) as e:
        S.check(tmp_path / "ckpt", 3, local_disk)
    msg = str(e.value)
    assert "not found on 2 of 3 node(s)" in msg and "10.0.0.2: no such file" in msg
    assert "10.0.0.3: a different file" in msg and "10.0.0.1" not in msg.split("(")[1].split(")")[0]
    assert "fix: put the run folders (the checkpoints are in them) on a file system every node mounts" in msg
    assert not (tmp_path / "ckpt" / S.MARKER).exists()


def test_fewer_nodes_than_the_recipe_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainError, match="only 1 node"):
        S.check(tmp_path, 2, lambda marker: {"10.0.0.1": marker.read_text()})
