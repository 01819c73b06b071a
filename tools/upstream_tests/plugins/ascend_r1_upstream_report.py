"""A pytest plugin, loaded into upstream test sessions (`-p ascend_r1_upstream_report`): one JSON line per
test outcome, written as it happens (a killed session keeps what it reported), and an optional selection.

    ASCEND_R1_UT_REPORT   the JSON-lines file to append to
    ASCEND_R1_UT_SELECT   a file of node ids, one a line: only these run (the rest is deselected); a
                          module's id (a collection error elsewhere) selects all of that module's tests

Records: {"id": nodeid, "outcome": passed|failed|error|skipped|xfailed|xpassed|collected, "message": ...}.
"collected" is a module that collected without error (so a collection error on one tree and not on the
other is a difference like any other). The runner puts this folder on PYTHONPATH after the tree; the
file imports nothing of ascend-r1.
"""

from __future__ import annotations

import json
import os

_OUT = os.environ.get("ASCEND_R1_UT_REPORT")
_SELECT = os.environ.get("ASCEND_R1_UT_SELECT")
_seen: dict[str, str] = {}


def _write(nodeid: str, outcome: str, message: str = "") -> None:
    if not _OUT:
        return
    message = message.replace(os.getcwd() + os.sep, "")  # the scratch tree's path says nothing
    with open(_OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": nodeid, "outcome": outcome, "message": message[:300]}) + "\n")


def _message(report) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None:
        return str(crash.message).strip().splitlines()[0] if str(crash.message).strip() else ""
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:  # a skip: (file, line, reason)
        return str(report.longrepr[2])
    text = str(report.longrepr or "").strip().splitlines()
    return text[-1] if text else ""


def pytest_collectreport(report) -> None:
    if not report.nodeid.endswith(".py"):
        return
    if report.failed:
        _write(report.nodeid, "error", _message(report))
    elif report.passed:
        _write(report.nodeid, "collected")


def pytest_collection_modifyitems(config, items) -> None:
    if not _SELECT:
        return
    with open(_SELECT, encoding="utf-8") as f:
        wanted = {line.rstrip("\n") for line in f if line.strip()}
    keep, drop = [], []
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        (keep if item.nodeid in wanted or module in wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_logreport(report) -> None:
    nodeid = report.nodeid
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.failed:
            outcome = "failed" if report.when == "call" else "error"
        else:
            outcome = report.outcome  # passed | skipped
        _seen[nodeid] = outcome
        _write(nodeid, outcome, "" if outcome in ("passed", "xpassed") else _message(report))
    elif report.when == "teardown" and report.failed and _seen.get(nodeid) != "error":
        _seen[nodeid] = "error"
        _write(nodeid, "error", "teardown: " + _message(report))
