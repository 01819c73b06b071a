"""`rebase`: move one upstream to a new ref, carry the series with 3-way merges, then record the new pin.

`carry`: bring another stack's series of the same upstream onto this stack's pin (3-way, with that stack's
pristine and patched objects fetched in so the merges have their bases); each carried commit gets a
`Ported-From: <stack>/<upstream>/<file>` trailer. Conflicts stop exactly as in a rebase (`--continue`,
`--abort`); patches that turn out empty are reported as already upstream.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tools import atomic
from tools import stacks as st
from tools.errors import UserError
from tools.patches import carry as accounts
from tools.patches import git as g
from tools.patches import manager, sources, stamp
from tools.patches.config import COMMIT_RE, Upstream
from tools.patches.series import load_series

STATE = "ascend-r1-rebase.json"


def _state_path(up: Upstream) -> Path:
    return g.gitdir(up.tree) / STATE


def _new_base(up: Upstream, ref: str, commit: str | None, tag: str | None) -> dict:
    """Fetch the new pristine sources; returns what the new pin will record."""
    url = None if sources.source_mode() == "pypi" else sources.git_url(up)
    if url is not None:
        g.git(up.tree, "fetch", "-q", url, ref, timeout=3600)
        new = g.rev(up.tree, "FETCH_HEAD")
        is_tag = g.git(up.tree, "ls-remote", "--exit-code", "--tags", url, ref, check=False).returncode == 0
        return {
            "base": new,
            "commit": new,
            "tag": ref if is_tag else (tag or ref),
            "source": "git",
            "pypi": None,
        }
    if up.pypi is None:
        raise UserError(f"{up.name}: git cannot reach {up.url} and there is no PyPI release to rebase onto")
    version = ref.removeprefix("v")
    if not (commit and COMMIT_RE.match(commit) and tag):
        raise UserError(
            f"{up.name}: without git, PyPI gives the files of {up.pypi.name}=={version} but not its commit id",
            fix=f"pass the release's tag and commit: `python -m tools.patches rebase {up.name} {ref} "
            f"--tag <tag> --commit <40-hex>` (from the release page), or rebase where git works",
        )
    archive = sources.download(up, version=version, sha256=None)
    new, _ = sources.import_archive(up, archive, version)
    return {
        "base": new,
        "commit": commit,
        "tag": tag,
        "source": "pypi",
        "pypi": {"version": version, "sha256": sources.sha256_file(archive), "archive": archive.name},
    }


def _patch_dir(up: Upstream, state: dict) -> Path:
    """Where the patches being carried live: this stack's series, or (carry) the other stack's."""
    source = state.get("from")
    return up.root / "patches" / source / up.name if source else up.patch_dir


def _mark_ported(up: Upstream, state: dict, name: str) -> None:
    """Add `Ported-From: <stack>/<upstream>/<file>` to HEAD's message (a carried patch's commit)."""
    trailer = f"Ported-From: {state['from']}/{up.name}/{name}"
    message = g.out(up.tree, "log", "-1", "--format=%B")
    if trailer in message:
        return
    new = g.git(up.tree, "interpret-trailers", "--trailer", trailer, input=message + "\n").stdout
    date = g.out(up.tree, "log", "-1", "--format=%aD")
    g.git(
        up.tree,
        "commit",
        "--amend",
        "-q",
        "--allow-empty",
        "-F",
        "-",
        input=new,
        env={"GIT_COMMITTER_DATE": date},
    )


def _settle(up: Upstream, state: dict) -> None:
    """After a conflict resolved by hand (`git am --continue` or `--skip`): record what became of it."""
    pending = state.pop("pending", None)
    if not pending:
        return
    name, before = pending
    if g.rev(up.tree, "HEAD") == before:
        state.setdefault("skipped", []).append(name)
    elif state.get("from"):
        _mark_ported(up, state, name)


def _carry(up: Upstream, state: dict) -> None:
    """Apply the remaining patches with 3-way merges; stop at a conflict with instructions."""
    _settle(up, state)
    for name in state["todo"][:]:
        before = g.rev(up.tree, "HEAD")
        code, output = manager.am(up.tree, _patch_dir(up, state) / name, three_way=True)
        if code == 0 and g.rev(up.tree, "HEAD") == before:
            state["empty"].append(name)  # git am: "No changes -- Patch already applied."
        elif code != 0 and "No changes" in output and not g.dirty_files(up.tree):
            g.git(up.tree, "am", "--skip", check=False)
            state["empty"].append(name)
        elif code != 0:
            state["todo"].remove(name)
            state["pending"] = [name, before]
            _state_path(up).write_text(json.dumps(state))
            conflicted = g.out(up.tree, "diff", "--name-only", "--diff-filter=U").split()
            onto = f"{up.ref} at {up.tag}" if state.get("from") else state["tag"]
            stack = f" --stack {up.stack}"
            raise UserError(
                f"{up.name}: {name} conflicts with {onto}"
                + (f" in: {', '.join(conflicted)}" if conflicted else ""),
                fix=f"edit the files in {up.path}, `git -C {up.path} add <files>`, `git -C {up.path} am --continue` "
                f"(or `am --skip` to drop the patch), then `python3 -m tools.patches rebase{stack} --continue {up.name}`",
            )
        elif state.get("from"):
            _mark_ported(up, state, name)
        state["todo"].remove(name)
        _state_path(up).write_text(json.dumps(state))


def _set_toml(up: Upstream, state: dict) -> None:
    path = up.root / st.Stack(up.stack, "").upstreams_toml
    text = path.read_text()
    m = re.search(rf"(?ms)^\[{re.escape(up.name)}\]\n(.*?)(?=^\[|\Z)", text)
    section = m.group(1)
    section = re.sub(r'(?m)^tag = ".*"$', f'tag = "{state["tag"]}"', section)
    section = re.sub(r'(?m)^commit = ".*"$', f'commit = "{state["commit"]}"', section)
    if state.get("pypi"):
        p = state["pypi"]
        section = re.sub(
            r"(?m)^pypi = \{.*\}$",
            f'pypi = {{ name = "{up.pypi.name}", version = "{p["version"]}", sha256 = "{p["sha256"]}" }}',
            section,
        )
    atomic.write_bytes(path, (text[: m.start(1)] + section + text[m.end(1) :]).encode())


def _finish(up: Upstream, state: dict) -> str:
    if state.get("from"):
        manager.export(up)
        _state_path(up).unlink(missing_ok=True)
        carried = len(state["names"]) - len(state["empty"]) - len(state.get("skipped", []))
        lines = [
            f"{up.ref}: carried {carried} of {len(state['names'])} patches from {state['from']}/{up.name}"
        ]
        if state["empty"]:
            lines.append("  already upstream (empty here): " + ", ".join(state["empty"]))
        if state.get("skipped"):
            lines.append("  dropped by hand (am --skip): " + ", ".join(state["skipped"]))
        lines.append(
            f"  record what became of each in patches/{up.stack}/carried.toml, fix each carried commit's Tested-By,"
            " then `make check-patches` and the tests"
        )
        return "\n".join(lines)
    g.git(up.tree, "update-ref", sources.BASE_REF, state["base"])
    pin = f"{state['tag']} {state['commit']}"
    manager.export(up, pin=pin)
    _set_toml(up, state)
    linked = st.default(up.root).name == up.stack  # only the default stack's trees are gitlinks
    if linked:
        g.git(up.root, "update-index", "--cacheinfo", f"160000,{state['commit']},{up.path.as_posix()}")
        sources.protect_gitlink(up)
    extra = {"source": state["source"], "base": state["base"]}
    if state.get("pypi"):
        extra.update({"archive": state["pypi"]["archive"], "archive_sha256": state["pypi"]["sha256"]})
    stamp.write(up.tree, extra)
    _state_path(up).unlink(missing_ok=True)
    lines = [
        f"{up.ref}: rebased onto {pin}; patches/{up.stack}/upstreams.toml"
        + (" and the gitlink updated" if linked else " updated (not the default stack: no gitlink)")
    ]
    if state["empty"]:
        lines.append("  dropped, already upstream (now empty): " + ", ".join(state["empty"]))
    lines.append("  review `git diff`, run `make check-patches` and the tests, then commit")
    return "\n".join(lines)


def rebase(up: Upstream, ref: str, *, commit: str | None = None, tag: str | None = None) -> str:
    if _state_path(up).exists() if g.is_repo(up.tree) else False:
        raise UserError(
            f"{up.name}: a rebase is already in progress",
            fix=f"`python -m tools.patches rebase --continue {up.name}` or `--abort {up.name}`",
        )
    manager.guard_user_work(up, action="rebase")
    old_head = g.rev(up.tree, "HEAD")
    names = [p.name for p in load_series(up)]
    state = _new_base(up, ref, commit, tag)
    state.update(
        {"todo": names, "empty": [], "old_head": old_head, "old_base": g.rev(up.tree, sources.BASE_REF)}
    )
    _state_path(up).write_text(json.dumps(state))
    g.git(up.tree, "checkout", "-q", "-f", "-B", sources.BRANCH, state["base"])
    _carry(up, state)
    return _finish(up, state)


def carry(up: Upstream, source: Upstream) -> str:
    """Carry `source`'s series (same upstream, another stack) onto `up`'s tree, on top of its own series."""
    if _state_path(up).exists() if g.is_repo(up.tree) else False:
        raise UserError(
            f"{up.ref}: a rebase or carry is already in progress",
            fix=f"`python3 -m tools.patches rebase --stack {up.stack} --continue {up.name}` or `--abort {up.name}`",
        )
    manager.require_tree(up)
    manager.require_tree(source)
    manager.guard_user_work(up, action=f"carry patches from {source.stack}")
    # the other stack's pristine and patched objects: the 3-way merges need the patches' pre-image blobs
    g.git(up.tree, "fetch", "-q", "--no-tags", str(source.tree.resolve()),
          f"+{sources.BASE_REF}:refs/ascend-r1/carry/{source.stack}/base",
          f"+HEAD:refs/ascend-r1/carry/{source.stack}/head")  # fmt: skip
    ported = {
        t.split("/", 2)[2]
        for p in load_series(up)
        for t in p.trailers.get("Ported-From", [])
        if t.startswith(f"{source.stack}/{up.name}/")
    }
    _, entries = accounts.load(up.stack, up.root)
    settled = {
        k.split("/", 1)[1]
        for k, e in entries.items()
        if k.startswith(f"{up.name}/") and e.get("status") != "pending"
    }
    names = [p.name for p in load_series(source) if p.name not in ported | settled]
    state = {"from": source.stack, "names": names, "todo": list(names), "empty": [], "tag": up.tag,
             "old_head": g.rev(up.tree, "HEAD")}  # fmt: skip
    _state_path(up).write_text(json.dumps(state))
    _carry(up, state)
    return _finish(up, state)


def _load_state(up: Upstream) -> dict:
    path = _state_path(up)
    if not path.exists():
        raise UserError(f"{up.name}: no rebase in progress")
    return json.loads(path.read_text())


def resume(up: Upstream) -> str:
    state = _load_state(up)
    if g.am_in_progress(up.tree):
        raise UserError(
            f"{up.name}: `git am` still has a patch open",
            fix=f"`git -C {up.path} am --continue` (after `git add`) or `git -C {up.path} am --skip`",
        )
    _carry(up, state)
    return _finish(up, state)


def abort(up: Upstream) -> str:
    state = _load_state(up)
    if g.am_in_progress(up.tree):
        g.git(up.tree, "am", "--abort", check=False)
    g.git(up.tree, "checkout", "-q", "-f", "-B", sources.BRANCH, state["old_head"])
    _state_path(up).unlink()
    return f"{up.name}: rebase aborted; back at {state['old_head'][:12]}"
