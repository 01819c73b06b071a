"""What became of another stack's patches on this one: patches/<stack>/carried.toml, checked and tabled.

Every patch of the stack named by `from` is accounted for exactly once:
- ported: a patch of this stack carries it (its `Ported-From: <stack>/<upstream>/<file>` trailer says so;
  `make rebase-upstream FROM=<stack>` adds the trailer);
- absorbed: upstream does it now (`by`: the upstream commit or PR, `where`: the file and function);
- not-needed: the reason is gone (`why`);
- pending: not carried yet (`why`: where it will be).
Absorbed and not-needed entries name a `test` that shows upstream's behaviour on CPU, or say why there is
none (`no-test`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from tools.errors import UserError
from tools.patches.config import REPO, Upstream
from tools.patches.series import load_series, read_series

FILE = "carried.toml"
STATUSES = {
    "absorbed": ("by", "where"),
    "not-needed": ("why",),
    "pending": ("why",),
}


@dataclass
class Outcome:
    patch: str  # <upstream>/<file> in the source stack
    subject: str
    status: str  # ported | absorbed | not-needed | pending
    detail: str
    test: str | None
    no_test: str | None = None
    by: str | None = None  # the patch of this stack that carries it (ported)


def path(stack: str, root: Path = REPO) -> Path:
    return root / "patches" / stack / FILE


def load(stack: str, root: Path = REPO) -> tuple[str | None, dict[str, dict]]:
    """(source stack, entries) of patches/<stack>/carried.toml; (None, {}) when the file is absent."""
    file = path(stack, root)
    if not file.exists():
        return None, {}
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{file}: not valid TOML: {e}") from None
    source = data.pop("from", None)
    if not isinstance(source, str):
        raise UserError(
            f'{file}: missing `from = "<stack>"`', fix="name the stack whose patches it accounts for"
        )
    return source, data


def outcomes(
    stack: str, per_stack: dict[str, list[Upstream]], root: Path = REPO
) -> tuple[str | None, list[Outcome], list[str]]:
    """(source stack, one outcome per source patch, problems) for `stack`."""
    source, entries = load(stack, root)
    if source is None:
        return None, [], []
    file = path(stack, root).relative_to(root)
    if source not in per_stack:
        return source, [], [f"{file}: from = {source!r} is not a stack"]
    ported: dict[str, list[str]] = {}
    for up in per_stack[stack]:
        for p in load_series(up):
            for t in p.trailers.get("Ported-From", []):
                if t.startswith(f"{source}/"):
                    ported.setdefault(t.split("/", 1)[1], []).append(f"{up.name}/{p.name}")
    problems: list[str] = []
    out: list[Outcome] = []
    known = set()
    for up in per_stack[source]:
        for p in load_series(up):
            key = f"{up.name}/{p.name}"
            known.add(key)
            entry = entries.get(key)
            if key in ported and entry:
                problems.append(
                    f"{file} [\"{key}\"]: ported by {', '.join(ported[key])}, so no entry may say otherwise"
                )
            if key in ported:
                out.append(Outcome(key, p.subject, "ported", "", None, by=", ".join(ported[key])))
                continue
            if not entry:
                problems.append(
                    f"{file}: {source}/{key} is not accounted for (port it with a Ported-From: trailer, "
                    "or add an entry: absorbed, not-needed or pending)"
                )
                continue
            status = entry.get("status")
            if status not in STATUSES:
                problems.append(
                    f"{file} [\"{key}\"]: status {status!r} is not one of ported (a trailer), {', '.join(STATUSES)}"
                )
                continue
            missing = [k for k in STATUSES[status] if not entry.get(k)]
            if status != "pending" and not (entry.get("test") or entry.get("no-test")):
                missing.append("test (or no-test)")
            if missing:
                problems.append(f"{file} [\"{key}\"]: status {status} needs {', '.join(missing)}")
            test = entry.get("test")
            if test and not (root / test.split("::", 1)[0]).is_file():
                problems.append(f'{file} ["{key}"]: test {test} does not exist')
            detail = "; ".join(str(entry[k]) for k in ("by", "where", "why") if entry.get(k))
            out.append(Outcome(key, p.subject, status, detail, test, entry.get("no-test")))
    for key in entries:
        if key not in known:
            problems.append(f'{file} ["{key}"]: no such patch in patches/{source}/*/series')
    return source, out, problems


def lint(stack: str, per_stack: dict[str, list[Upstream]], root: Path = REPO) -> list[str]:
    """carried.toml's problems, and Ported-From: trailers that name no patch."""
    problems = outcomes(stack, per_stack, root)[2]
    series = {f"{s}/{u.name}": set(read_series(u)) for s, ups in per_stack.items() for u in ups}
    for up in per_stack[stack]:
        for p in load_series(up):
            for t in p.trailers.get("Ported-From", []):
                where, _, file = t.rpartition("/")
                if file not in series.get(where, set()):
                    problems.append(
                        f"{p.path}: Ported-From: {t}, but patches/{where}/series does not list {file}"
                    )
    return problems


def render(stack: str, per_stack: dict[str, list[Upstream]], root: Path = REPO) -> list[str]:
    source, rows, _ = outcomes(stack, per_stack, root)
    if source is None:
        return []
    counts = {s: sum(r.status == s for r in rows) for s in ("ported", "absorbed", "not-needed", "pending")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    lines = [
        f"## From `{source}` to `{stack}`",
        "",
        f"What became of each patch of `{source}` on `{stack}` ({summary}); from "
        f"[patches/{stack}/{FILE}](../patches/{stack}/{FILE}) and the `Ported-From:` trailers.",
        "",
        f"| {source} patch | on {stack} | where, by what, or why | test |",
        "|---|---|---|---|",
    ]
    for r in rows:
        up, file = r.patch.split("/", 1)
        link = f"[{r.subject}](../patches/{source}/{up}/{file})"
        if r.status == "ported":
            what = "ported: " + ", ".join(f"[{by}](../patches/{stack}/{by})" for by in r.by.split(", "))
            test = "its own (see the table above)"
        else:
            what = r.status
            test = f"[`{r.test}`](../{r.test.split('::')[0]})" if r.test else (r.no_test or "—")
        lines.append(f"| {link} | {what} | {r.detail or '—'} | {test} |".replace("\n", " "))
    return lines
