"""tools/launch/watchdog.py and procs.freeze_and_kill: what makes `make train` end a failed or stalled run
(the end-to-end faults are tests/current/test_faults_e2e.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tools.errors import UserError
from tools.launch import watchdog as W
from tools.launch.procs import freeze_and_kill

# lines as verl 0.9.1's driver prints them (Ray's prefixes, vLLM's records)
WARNING_TRACEBACK = [
    "(vLLMHttpServer pid=4242) WARNING 11-26 19:42:13 [base.py:268] Chat template warmup failed\n",
    "(vLLMHttpServer pid=4242) WARNING 11-26 19:42:13 [base.py:268] Traceback (most recent call last):\n",
    '(vLLMHttpServer pid=4242) WARNING 11-26 19:42:13 [base.py:268]   File "x.py", line 1, in f\n',
    "(vLLMHttpServer pid=4242) WARNING 11-26 19:42:13 [base.py:268] ValueError: Tokenizer not available\n",
]
LOAD_FAILED = [
    "(vLLMHttpServer pid=4242) Traceback (most recent call last):\n",
    '(vLLMHttpServer pid=4242)   File "deepseek_v2.py", line 1, in load_weights\n',
    "(vLLMHttpServer pid=4242) AssertionError: Attempted to load weight (torch.Size([256, 512])) into parameter (torch.Size([0]))\n",
]


def feed(w: W.Watch, lines: list[str], t: float) -> None:
    for line in lines:
        w.line(line, t)


def test_ray_prefixes_name_the_process() -> None:
    assert W.split_prefix("(TaskRunner pid=12) hello\n") == ("TaskRunner pid=12", "hello")
    assert W.split_prefix("(WorkerDict pid=5, ip=10.0.0.1) x") == ("WorkerDict pid=5", "x")
    assert W.split_prefix("(raylet) A worker died or was killed") == ("raylet", "A worker died or was killed")
    assert W.split_prefix("plain") == ("verl's driver", "plain")
    assert W.split_prefix("\x1b[36m(vLLMHttpServer pid=3)\x1b[0m (EngineCore pid=4) ERROR 11-26 x") == (
        "vLLMHttpServer pid=3 / EngineCore pid=4",
        "ERROR 11-26 x",
    )
    assert W.split_prefix("(vLLMHttpServer pid=1) (Worker_TP1_EP1 pid=2) AssertionError: x") == (
        "vLLMHttpServer pid=1 / Worker_TP1_EP1 pid=2",
        "AssertionError: x",
    )


def test_a_tensor_parallel_worker_s_exception_inside_its_server_fails_the_run() -> None:
    w = W.Watch(stall_s=100, fail_grace_s=0, start=0)
    w.line("(vLLMHttpServer pid=1) (Worker_TP1_EP1 pid=2) Traceback (most recent call last):\n", 1)
    w.line(
        "(vLLMHttpServer pid=1) (Worker_TP1_EP1 pid=2) BufferError: cannot close exported pointers exist\n", 1
    )
    f = w.verdict(1)
    assert (
        f is not None
        and f.process.endswith("Worker_TP1_EP1 pid=2")
        and f.first_error.startswith("BufferError")
    )


def test_a_warning_s_traceback_is_not_a_failure() -> None:
    w = W.Watch(stall_s=100, fail_grace_s=10, start=0)
    feed(w, WARNING_TRACEBACK, 1)
    assert w.failure is None and w.verdict(50) is None


def test_an_exception_with_no_progress_after_it_fails_the_run_after_the_grace() -> None:
    w = W.Watch(stall_s=100, fail_grace_s=10, start=0)
    feed(w, LOAD_FAILED, 5)
    assert w.verdict(14) is None
    f = w.verdict(15)
    assert f is not None and f.kind == "failed" and f.process == "vLLMHttpServer pid=4242"
    assert f.first_error.startswith("AssertionError: Attempted to load weight")


def test_the_exception_inside_a_vllm_error_record_is_what_the_run_reports() -> None:
    w = W.Watch(stall_s=100, fail_grace_s=10, start=0)
    p = "\x1b[36m(vLLMHttpServer pid=9)\x1b[0m (EngineCore pid=10) "
    feed(
        w,
        [
            p + "ERROR 11-26 20:20:10 [core.py:1617] Invocation of collective_rpc method failed\n",
            p + "ERROR 11-26 20:20:10 [core.py:1617] Traceback (most recent call last):\n",
            p + 'ERROR 11-26 20:20:10 [core.py:1617]   File "x.py", line 3, in load_weights\n',
            p + "ERROR 11-26 20:20:10 [core.py:1617] RuntimeError: injected fault: load_weights raised\n",
        ],
        1,
    )
    f = w.verdict(11)
    assert f is not None and f.process == "vLLMHttpServer pid=9 / EngineCore pid=10"
    assert f.first_error == "RuntimeError: injected fault: load_weights raised"


def test_progress_after_an_error_means_the_run_survived_it() -> None:
    w = W.Watch(stall_s=100, fail_grace_s=10, start=0)
    feed(w, LOAD_FAILED, 5)
    w.progress(8)
    assert w.verdict(30) is None


@pytest.mark.parametrize(
    "line",
    [
        "(raylet) A worker died or was killed while executing a task by an unexpected system error.\n",
        "(TaskRunner pid=3) ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n",
        "(EngineCore_DP0 pid=9) ERROR 11-26 19:42:13 [core.py:1] EngineCore encountered a fatal error.\n",
    ],
)
def test_ray_and_vllm_death_notices_are_failures(line: str) -> None:
    w = W.Watch(stall_s=100, fail_grace_s=0, start=0)
    w.line(line, 1)
    assert w.verdict(1) is not None and w.verdict(1).kind == "failed"


def test_a_quiet_run_stalls_and_a_chatty_one_without_progress_too() -> None:
    w = W.Watch(stall_s=10, fail_grace_s=5, start=0)
    assert w.verdict(9) is None
    assert w.verdict(10).kind == "stalled"
    chatty = W.Watch(stall_s=10, fail_grace_s=5, start=0)
    for t in range(0, 40):
        chatty.line("(raylet) still here\n", t)
        if t < 39:
            assert chatty.verdict(t) is None
    assert chatty.verdict(40).kind == "stalled"


def test_settings_refuse_nonsense() -> None:
    assert W.settings({"watchdog": {"stall_s": 60, "fail_grace_s": 5}}) == (60.0, 5.0)
    with pytest.raises(UserError, match="stall_s"):
        W.settings({"watchdog": {"stall_s": 0}})


WRITER = """
import subprocess, sys, time
# a child that starts a grandchild, both appending to the file every 20 ms
code = "import sys, time\\nwhile True:\\n    open(sys.argv[1], 'a').write('x'); time.sleep(0.02)"
subprocess.Popen([sys.executable, "-c", code, sys.argv[1]])
while True:
    open(sys.argv[1], "a").write("y"); time.sleep(0.02)
"""


def test_freeze_and_kill_stops_every_writer_at_once(tmp_path: Path) -> None:
    out = tmp_path / "written"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], start_new_session=True)
    time.sleep(1.5)
    root = psutil.Process(proc.pid)
    procs = [root, *root.children(recursive=True)]
    assert len(procs) == 2
    stopped = freeze_and_kill(lambda: [p for p in [root, *root.children(recursive=True)] if p.is_running()])
    size = out.stat().st_size
    time.sleep(0.5)
    proc.wait(5)
    assert {p.pid for p in stopped} == {p.pid for p in procs}
    assert out.stat().st_size == size, "a process wrote after it was stopped"
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_stack_dump_names_where_a_process_is(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time\ndef stuck_here():\n    time.sleep(60)\nstuck_here()"]
    )
    try:
        time.sleep(1.0)
        (path,) = W.dump_stacks([psutil.Process(proc.pid)], tmp_path)
        assert "stuck_here" in path.read_text(), path.read_text()
    finally:
        proc.kill()
