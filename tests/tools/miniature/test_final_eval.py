"""The trained actor's final evaluation (tools/miniature/final_eval.py): which checkpoint folder it exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.miniature import final_eval as FE


def test_the_actor_checkpoint_of_either_verl(tmp_path: Path) -> None:
    """The final evaluation exports the actor's model checkpoint: verl 0.6.0 saves it in actor/dist_ckpt,
    verl 0.9.1 in the model entry of actor/ckpt_contents.json (actor/model/dist_ckpt, beside the
    optimizer's and the RNG state's own dist_ckpt folders, which must not be taken for it)."""
    old = tmp_path / "published" / "actor"
    (old / "dist_ckpt").mkdir(parents=True)
    (old / "dist_ckpt" / "metadata.json").write_text("{}")
    assert FE.actor_model_checkpoint(old) == old / "dist_ckpt"

    new = tmp_path / "current" / "actor"
    for part in ("extra", "optimizer", "model"):
        (new / part / "dist_ckpt").mkdir(parents=True)
        (new / part / "dist_ckpt" / "metadata.json").write_text("{}")
    contents = {
        "contents": {"model": {"path": "model/dist_ckpt"}, "optimizer": {"path": "optimizer/dist_ckpt"}}
    }
    (new / "ckpt_contents.json").write_text(json.dumps(contents))
    assert FE.actor_model_checkpoint(new) == new / "model" / "dist_ckpt"

    with pytest.raises(FE.UserError, match="no actor model checkpoint"):
        FE.actor_model_checkpoint(tmp_path / "none" / "actor")
