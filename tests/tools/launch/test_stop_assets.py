"""SIGTERM while `make train` makes its assets, before verl starts: every process it started goes before it
writes another file, the asset being made is not left half-written, and the launcher exits 143 saying so.

Without the SIGTERM handler (tools.errors.stop_on_sigterm), Python dies at once: the asset's `.partial`
folder stays, and a command it runs (hf-to-mcore, the data converter) goes on writing as an orphan.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[3]

LAUNCHER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tools.errors import exit_status, stop_on_sigterm
    from tools.miniature import assets

    # like hf-to-mcore, a command that writes into the asset's .partial folder and starts a helper that
    # writes there too; each file is named <role>-<pid>-<n>
    WRITER = '''
    import os, subprocess, sys, time
    tmp, role = sys.argv[1], sys.argv[2]
    os.makedirs(tmp, exist_ok=True)
    if role == "command":
        subprocess.Popen([sys.executable, "-c", sys.argv[3], tmp, "helper", sys.argv[3]])
    n = 0
    while True:
        n += 1
        with open(os.path.join(tmp, f"{role}-{os.getpid()}-{n}"), "w") as f:
            f.write("x")
        time.sleep(0.05)
    '''

    def main():
        folder = Path(sys.argv[1])
        with stop_on_sigterm(), assets._partial(folder, mkdir=False) as tmp:
            assets._run([sys.executable, "-c", WRITER, str(tmp), "command", WRITER], "the writer")
        return 0

    sys.exit(exit_status(main))
    """
)


def _writers(tmp: Path) -> set[int]:
    return {int(p.name.split("-")[1]) for p in tmp.glob("*-*-*")} if tmp.exists() else set()


def test_sigterm_while_a_command_makes_an_asset(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    partial = folder.with_name("model.partial")
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(folder)], cwd=REPO, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while len(_writers(partial)) < 2:  # the command and its helper both write
        assert proc.poll() is None and time.monotonic() < deadline, "the writers never started"
        time.sleep(0.05)
    pids = _writers(partial)
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    took = time.monotonic() - t
    assert rc == 143, proc.stderr.read()
    assert "stopped (SIGTERM)" in proc.stderr.read()
    assert took < 5.0, f"the stop took {took:.1f} s"
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes the launcher started still run: {alive}"
    time.sleep(0.5)  # nothing writes there any more
    assert not partial.exists() and not folder.exists()


def test_sigterm_while_the_base_model_is_made_by_make_train(tmp_path: Path) -> None:
    """The real launcher (`python -m tools.launch train`, tiny-learn, whose base model is pre-trained for
    minutes in the launcher itself): SIGTERM during that ends it in seconds with exit 143 and one line;
    the half-made model folder is removed."""
    name = f"test-stop-assets-{uuid.uuid4().hex[:8]}"
    root = REPO / "build" / name  # assets are made only under the checkout (tools/launch/train.py)
    env = {**os.environ, "ASCEND_R1_LEARN": str(root), "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "tools.launch",
        "train",
        "--recipe",
        "tiny-learn",
        "--run",
        name,
        "--no-plan",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("pre-training the base model"):
                break
        else:
            raise AssertionError("the base model's pre-training never started:\n" + "".join(lines))
        time.sleep(1.0)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[0]
        took = time.monotonic() - t
        assert proc.returncode == 143, "".join(lines) + rest
        assert "stopped (SIGTERM) before verl started" in rest, rest
        assert took < 10.0, f"the stop took {took:.1f} s"
        made = list(root.rglob("*.partial"))
        assert not made, f"half-made assets left behind: {made}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["rm", "-rf", str(root)], check=False)
        for stack_runs in (REPO / "outputs").glob(f"*/{name}"):
            subprocess.run(["rm", "-rf", str(stack_runs)], check=False)
