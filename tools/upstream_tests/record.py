"""patches/<stack>/upstream-tests.verified.toml: the record of `make upstream-tests`, so CI runs only what changed.

Each check of patches/<stack>/upstream-tests.toml that ran with no regression (or that the series gives
nothing to read: 'not applicable') gets an entry '<upstream>/<check>' keyed by a digest of everything that
verdict depends on:
- the stack's pins (patches/<stack>/upstreams.toml, every upstream: a test may import the other trees);
- that upstream's series, in order, with each patch file's bytes (the patched tree);
- the check's entry in the harness config (all but the words `what` and `manual`, and `ci`, which only
  chooses the runs it is in) and its upstream's settings (package, import, checks-from's commit);
- the check's harness patches and the runner's pytest plugins (tools/upstream_tests/plugins);
- the environment lock of the stack and profile (locks/<stack>/<profile>.txt);
- the commit the tests come from (the pin's commit, or checks-from's; the release archive's sha256 is a pin);
- RECORD_VERSION (bumped when the verdict logic of tools/upstream_tests changes).
`make upstream-tests CHANGED=1` (CI) runs only the checks whose entry does not match. The file format and
the digest framing are those of patches/<stack>/verified.toml (tools/patches/record.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from tools.patches import record as rec
from tools.patches.config import Upstream
from tools.patches.series import read_series
from tools.upstream_tests.config import HARNESS_DIR, Check, UpstreamTests

RECORD_VERSION = "1"
FILE = "upstream-tests.verified.toml"
PLUGINS = Path(__file__).resolve().parent / "plugins"
VERDICTS = ("no regressions", "not applicable")  # the verdicts a record vouches for
HEADER = """\
# Written by `make upstream-tests` (tools/upstream_tests/record.py); do not edit by hand.
# One entry per upstream check (patches/<stack>/upstream-tests.toml) that found no test passing on the
# pristine pin and failing on the patched tree, keyed by the digest of what that verdict depends on (the
# stack's pins, the upstream's series, the check's config and harness patches, the lock, the tests' commit).
# CI (`make upstream-tests CHANGED=1`) runs only checks whose digest differs; a stale check that cannot run
# there fails as UNVERIFIED. After changing any of those: `make upstream-tests STACK=<stack> UP=<upstream>`
# (CHECK=<check> for one) where git reaches the upstream repository, and commit this file.
"""


def record_path(root: Path, stack: str) -> Path:
    return root / "patches" / stack / FILE


def key(upstream: str, check: str) -> str:
    return f"{upstream}/{check}"


def refresh_command(stack: str, upstream: str | None = None, check: str | None = None) -> str:
    up = f" UP={upstream}" if upstream else ""
    one = f" CHECK={check}" if check else ""
    return f"make upstream-tests STACK={stack}{up}{one}"


def load(root: Path, stack: str) -> dict[str, rec.Entry]:
    return rec.load_file(record_path(root, stack), refresh_command(stack))


def save(root: Path, stack: str, entries: dict[str, rec.Entry]) -> None:
    rec.save_file(record_path(root, stack), entries, HEADER)


def matches(entry: rec.Entry | None, digest: str) -> bool:
    return entry is not None and entry.verdict in VERDICTS and entry.digest == digest


def tests_commit(up: Upstream, spec: UpstreamTests) -> str:
    """Where the check's files that the release archive lacks come from."""
    if up.commit:
        return up.commit
    if spec.checks_from is not None:
        return spec.checks_from.commit
    return "none"


def digest(
    root: Path, up: Upstream, spec: UpstreamTests, check: Check, profile: str, plugins: Path = PLUGINS
) -> str:
    """sha256 of what the verdict of `check` on `up` depends on (the module docstring), as 64 hex digits."""
    h = rec.Digest()
    h.part("record-version", RECORD_VERSION.encode())
    h.part("pins", rec.pins(root, up.stack).encode())
    names = read_series(up)
    h.part(f"series {up.name}", "\n".join(names).encode())
    for name in names:
        h.part(f"patch {up.name}/{name}", rec.file_bytes(up.patch_dir / name))
    harness_dir = root / "patches" / up.stack / HARNESS_DIR
    entry = {k: v for k, v in asdict(check).items() if k not in ("what", "manual", "ci")}
    entry["harness_patches"] = [p.relative_to(harness_dir).as_posix() for p in check.harness_patches]
    h.part("check", json.dumps(entry, sort_keys=True).encode())
    settings = {"package": spec.package, "import": spec.imports}
    h.part("upstream", json.dumps(settings, sort_keys=True).encode())
    h.part("tests-from", tests_commit(up, spec).encode())
    for p in check.harness_patches:
        h.part(f"harness {p.relative_to(harness_dir).as_posix()}", rec.file_bytes(p))
    if plugins.is_dir():
        for p in sorted(plugins.rglob("*.py")):
            h.part(f"plugin {p.relative_to(plugins).as_posix()}", p.read_bytes())
    h.part("lock", rec.file_bytes(root / "locks" / up.stack / f"{profile}.txt"))
    return h.hexdigest()
