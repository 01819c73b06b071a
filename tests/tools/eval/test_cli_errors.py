"""make eval refuses bad input with the project's error style (exit 2, `error:` and `fix:`), before any
engine starts: K below 1, a step with no checkpoint, an unknown benchmark, a folder that is not a run, and a
resumed evaluation whose data file changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.errors import USER_ERROR, exit_status
from tools.eval.cli import main
from tools.eval.folder import EvalFolder


@pytest.fixture
def run(tmp_path: Path) -> Path:
    r = tmp_path / "run"
    (r / "checkpoints" / "global_step_5").mkdir(parents=True)
    (r / "config.yaml").write_text(
        f"launch:\n  paths:\n    hf_model: {tmp_path / 'model'}\n    data: {tmp_path / 'data'}\n"
    )
    return r


@pytest.mark.parametrize(
    "args,said",
    [
        (["--k", "0"], "K=0"),
        (["--step", "7"], "no checkpoint of step 7"),
        (["--step", "0"], "base model is not there"),
        (["--step", "5", "--bench", "aime99"], "unknown benchmark 'aime99'"),
    ],
)
def test_refused(run: Path, args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status(main, ["--run", str(run), *args]) == USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and "  fix: " in err


def test_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status(main, ["--run", str(tmp_path)]) == USER_ERROR
    assert "not a run folder" in capsys.readouterr().err


def test_resume_refuses_a_changed_data_file(tmp_path: Path) -> None:
    settings = {"k": 2, "sha256": "aaa"}
    f = EvalFolder(tmp_path / "test", settings)
    f.add([{"id": "p0", "sample": 0}, {"id": "p0", "sample": 1}, {"id": "p1", "sample": 0}])
    again = EvalFolder(tmp_path / "test", settings)
    assert again.done() == {"p0"}  # p1 is sampled again, p0 is not
    with pytest.raises(Exception, match="other settings.*sha256"):
        EvalFolder(tmp_path / "test", {**settings, "sha256": "bbb"})
    assert json.loads((tmp_path / "test" / "settings.json").read_text())["sha256"] == "aaa"
