"""Pristine against patched: which differences count.

Only a test that PASSES on the pristine pin and FAILS on the patched tree is a regression (and one that
exists only on the patched tree and fails there). A test that fails on both trees fails for a reason
the series did not bring (no network, a package this environment lacks, a CUDA-only path): listed, never
counted. A test that fails pristine and passes patched is newly passing: reported, never a failure.

The speed rule: the patched tree runs in full; the pristine tree runs only what failed patched (a
regression must fail patched), and a regression is confirmed by running it on the patched tree once more
(what passes then was flaky: reported, not counted). `--full` runs the pristine tree in full as well,
which is what measures "newly passing".
"""

from __future__ import annotations

from dataclasses import dataclass, field

PASS = frozenset({"passed", "xpassed", "collected"})
SESSION = "<session>"  # the pytest session itself: "collected" when it ran, "error" when it could not
FAIL = frozenset({"failed", "error"})


@dataclass(frozen=True)
class Result:
    outcome: str
    message: str = ""


Results = dict[str, Result]


@dataclass
class Comparison:
    patched_run: int = 0  # ids with an outcome on the patched tree (collected modules not counted)
    patched_passed: int = 0
    pristine_run: int = 0
    pristine_passed: int = 0
    pristine_full: bool = False  # the pristine tree ran in full (else only the patched failures)
    regressions: list[tuple[str, str, str]] = field(default_factory=list)  # id, patched msg, pristine
    new_failing: list[tuple[str, str]] = field(default_factory=list)  # only on the patched tree, failing
    both_fail: list[tuple[str, str]] = field(default_factory=list)  # id, patched message
    newly_passing: list[tuple[str, str]] = field(default_factory=list)  # id, pristine message
    flaky: list[tuple[str, str]] = field(default_factory=list)  # failed patched once, passed on retry
    changed: list[tuple[str, str, str]] = field(default_factory=list)  # other changes: id, pristine, patched

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.new_failing)


def _count(results: Results) -> tuple[int, int]:
    tests = {k: v for k, v in results.items() if v.outcome != "collected"}
    return len(tests), sum(v.outcome in PASS for v in tests.values())


def retry_candidates(patched: Results, pristine: Results) -> list[str]:
    """Ids to run on the patched tree once more: they failed there, and passed pristine or are new."""
    return sorted(
        k
        for k, v in patched.items()
        if v.outcome in FAIL
        and (pristine[k].outcome in PASS if k in pristine else not _module_failed(k, pristine))
    )


def compare(
    patched: Results, pristine: Results, *, pristine_full: bool, retry: Results | None = None
) -> Comparison:
    """Classify every id. `pristine` holds the pristine outcomes (all, or the re-run patched failures);
    `retry` the outcomes of the second patched run of `retry_candidates`."""
    c = Comparison(pristine_full=pristine_full)
    c.patched_run, c.patched_passed = _count(patched)
    c.pristine_run, c.pristine_passed = _count(pristine)
    retry = retry or {}
    for k in sorted(set(patched) | set(pristine)):
        new, old = patched.get(k), pristine.get(k)
        if new is not None and new.outcome in FAIL:
            again = retry.get(k)
            if again is not None and again.outcome in PASS:
                c.flaky.append((k, new.message))
            elif old is None and _module_failed(k, pristine):
                c.both_fail.append((k, new.message))  # the pristine tree cannot even run it
            elif old is None:
                c.new_failing.append((k, new.message))
            elif old.outcome in PASS:
                c.regressions.append((k, new.message, old.outcome))
            elif old.outcome in FAIL:
                c.both_fail.append((k, new.message))
            else:
                c.changed.append((k, old.outcome, new.outcome))
        elif new is not None and new.outcome in PASS:
            if old is not None and old.outcome in FAIL and k != SESSION:
                c.newly_passing.append((k, old.message))
            elif old is not None and old.outcome not in PASS:
                c.changed.append((k, old.outcome, new.outcome))
        elif new is not None and old is not None and old.outcome != new.outcome:
            c.changed.append((k, old.outcome, new.outcome))  # e.g. passed pristine, skipped patched
        elif new is None and old is not None and old.outcome in PASS and pristine_full:
            c.changed.append((k, old.outcome, "absent"))  # the patched tree lost a test
    return c


def _module_failed(nodeid: str, results: Results) -> bool:
    """Could the tree behind `results` not run `nodeid` at all: its module failed to collect, or the
    whole session failed (e.g. its conftest does not import)?"""
    module = results.get(nodeid.split("::", 1)[0])
    session = results.get(SESSION)
    return (module is not None and module.outcome in FAIL) or (
        nodeid != SESSION and session is not None and session.outcome in FAIL
    )
