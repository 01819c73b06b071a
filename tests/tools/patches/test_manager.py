"""The patch manager against real git repositories made in temporary folders."""

from __future__ import annotations

import pytest

from tests.tools.patches.gitfixtures import TRAILERS, project_with_patch, sh, write_toml
from tools.errors import UserError
from tools.patches import git as g
from tools.patches import manager, rebase, sources, stamp
from tools.patches.check import check_one
from tools.patches.series import lint, read_series


def patch_bytes(p) -> dict[str, bytes]:
    d = p.root / "patches" / "alpha" / "demo"
    return {f.name: f.read_bytes() for f in sorted(d.iterdir())}


def test_export_writes_series_and_mails(tmp_path):
    p = project_with_patch(tmp_path)
    names = read_series(p.upstream())
    assert names == ["demo-core-change-greeting.patch", "demo-util-raise-Y.patch"]
    text = (p.root / "patches/alpha/demo" / names[0]).read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 ")  # --zero-commit
    assert "Subject: [PATCH] demo: core: change greeting" in text
    assert "index " in text and len(text.split("index ")[1].split("..")[0]) == 40  # --full-index
    assert "Upstream-Status: Pending" in text
    assert (p.root / "patches/alpha/demo/series").read_text().splitlines()[1] == f"# made-for: v1 {p.v1}"
    assert lint(p.upstream(), {"demo": names}) == []


def test_apply_then_export_is_byte_identical_and_commits_reproducible(tmp_path):
    p = project_with_patch(tmp_path)
    before = patch_bytes(p)
    up = p.upstream()
    manager.unapply(up)
    assert g.rev(p.tree, "HEAD") == p.v1
    assert "applied 2 patches" in manager.apply(up)
    head1 = g.rev(p.tree, "HEAD")
    assert (p.tree / "util.py").read_text() == "X = 1\nY = 20\nZ = 3\n"
    manager.export(up)
    assert patch_bytes(p) == before
    manager.unapply(up)
    manager.apply(up)
    assert g.rev(p.tree, "HEAD") == head1  # committer = author date: same commit ids every time


def test_apply_is_a_noop_when_stamped(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    manager.unapply(up)
    manager.apply(up)
    head = g.rev(p.tree, "HEAD")
    assert "up to date" in manager.apply(up)
    assert g.rev(p.tree, "HEAD") == head
    # a changed series is applied again
    series = p.root / "patches/alpha/demo/series"
    series.write_text("\n".join(series.read_text().splitlines()[:-1]) + "\n")
    assert "applied 1 patches" in manager.apply(up)


def test_refuses_local_edits_and_keeps_them(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    (p.tree / "hello.py").write_text("my precious edit\n")
    for action in (manager.apply, manager.unapply):
        with pytest.raises(UserError) as e:
            action(up)
        assert "local edits" in str(e.value) and "hello.py" in str(e.value)
        assert "export-patches" in str(e.value)
    assert (p.tree / "hello.py").read_text() == "my precious edit\n"


def test_refuses_unexported_commits(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    p.commit_in_tree("util.py", "X = 1\nY = 20\nZ = 30\n", subject="demo: util: new work")
    head = g.rev(p.tree, "HEAD")
    with pytest.raises(UserError) as e:
        manager.apply(up)
    assert "not in patches/alpha/demo" in str(e.value) and "new work" in str(e.value)
    assert "make export-patches STACK=alpha UP=demo" in str(e.value)
    assert g.rev(p.tree, "HEAD") == head
    manager.export(up)  # keeping them is one command
    assert len(read_series(up)) == 3
    assert "up to date" in manager.apply(up)


def test_already_applied_tree_is_not_reapplied_twice(tmp_path):
    p = project_with_patch(tmp_path)  # export leaves the tree stamped as applied
    assert "up to date" in manager.apply(p.upstream())


def test_broken_patch_is_named(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    manager.unapply(up)
    path = p.root / "patches/alpha/demo/demo-util-raise-Y.patch"
    path.write_text(path.read_text().replace("@@ -1,3 +1,3 @@", "@@ -1,3 +1,9 @@ garbage"))
    with pytest.raises(UserError) as e:
        manager.apply(up)
    msg = str(e.value)
    assert "demo-util-raise-Y.patch does not apply" in msg and "broken patch" in msg
    assert "made for: v1" in msg


def test_context_mismatch_names_file_and_hunk(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    manager.unapply(up)
    path = p.root / "patches/alpha/demo/demo-util-raise-Y.patch"
    path.write_text(path.read_text().replace(" Z = 3\n", " Z = 4\n"))
    with pytest.raises(UserError) as e:
        manager.apply(up)
    msg = str(e.value)
    assert "file util.py, hunk 1" in msg
    assert "does not match the pinned sources" in msg and "export-patches" in msg
    assert g.rev(p.tree, "HEAD") != p.v1 and not g.am_in_progress(p.tree)  # stops after the good patch


def test_upstream_changed_since_patch_was_made(tmp_path):
    p = project_with_patch(tmp_path)
    (p.origin / "util.py").write_text("X = 1\nY = 2\nZ = 3\nW = 4\n")
    (p.origin / "hello.py").write_text("def greet():\n    return 'hey'\n")
    sh(p.origin, "commit", "-qam", "v2")
    sh(p.origin, "tag", "v2")
    v2 = sh(p.origin, "rev-parse", "HEAD")
    write_toml(p.root, p.origin.as_uri(), "v2", v2)  # a pin bumped by hand, series made for v1
    sh(p.tree, "fetch", "-q", "origin", "v2")
    g.git(p.tree, "update-ref", sources.BASE_REF, v2)
    with pytest.raises(UserError) as e:
        manager.apply(p.upstream())
    msg = str(e.value)
    assert "upstream changed since the patch was made" in msg
    assert f"made for v1 {p.v1}" in msg and "make rebase-upstream STACK=alpha UP=demo REF=v2" in msg


def test_applies_but_to_another_version_warns(tmp_path):
    p = project_with_patch(tmp_path)
    (p.origin / "README").write_text("unrelated\n")
    sh(p.origin, "add", "README")
    sh(p.origin, "commit", "-qm", "v1.1")
    sh(p.origin, "tag", "v1.1")
    v11 = sh(p.origin, "rev-parse", "HEAD")
    write_toml(p.root, p.origin.as_uri(), "v1.1", v11)
    sh(p.tree, "fetch", "-q", "origin", "v1.1")
    g.git(p.tree, "update-ref", sources.BASE_REF, v11)
    out = manager.apply(p.upstream())
    assert "applied 2 patches" in out and "applies, but the series was made for v1" in out


def test_tree_not_pristine_is_diagnosed_by_blob_ids(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    manager.unapply(up)
    # the base commit itself differs from what the patches were made against (a bad source archive)
    (p.tree / "util.py").write_text("X = 1\nY = 2\nZ = 3  # local\n")
    sh(p.tree, "commit", "-qam", "not the pin")
    g.git(p.tree, "update-ref", sources.BASE_REF, "HEAD")
    with pytest.raises(UserError) as e:
        manager.apply(up)
    assert "the tree is not the pristine pin" in str(e.value) and "util.py: patch expects blob" in str(
        e.value
    )


def test_ctrl_c_mid_series_leaves_a_recoverable_tree(tmp_path, monkeypatch):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    manager.unapply(up)
    real_am, calls = manager.am, []

    def interrupted_am(tree, patch, three_way=False):
        calls.append(patch.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_am(tree, patch, three_way=three_way)

    monkeypatch.setattr(manager, "am", interrupted_am)
    with pytest.raises(UserError, match="interrupted"):
        manager.apply(up)
    assert g.rev(p.tree, "HEAD") == p.v1
    monkeypatch.setattr(manager, "am", real_am)
    assert "applied 2 patches" in manager.apply(up)


def test_killed_apply_is_recovered(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    manager.unapply(up)
    # what a SIGKILL leaves: the stamp says "applying", one patch in, `git am` stopped half way
    stamp.write(p.tree, {"applying": True})
    manager.am(p.tree, p.root / "patches/alpha/demo/demo-core-change-greeting.patch")
    bad = p.root / "bad.patch"
    bad.write_text((p.root / "patches/alpha/demo/demo-core-change-greeting.patch").read_text())
    code, _ = manager.am(p.tree, bad)
    assert code != 0 and g.am_in_progress(p.tree)
    assert "recovered an interrupted apply" in manager.apply(up)
    assert not g.am_in_progress(p.tree)
    assert (p.tree / "util.py").read_text() == "X = 1\nY = 20\nZ = 3\n"


def test_malformed_patch_fails_before_the_tree_moves(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    manager.unapply(up)
    (p.root / "patches/alpha/demo/demo-core-change-greeting.patch").write_text("this is not a patch\n")
    with pytest.raises(UserError, match="not a git format-patch mail"):
        manager.apply(up)
    assert g.rev(p.tree, "HEAD") == p.v1


def test_series_naming_a_missing_file(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    manager.unapply(up)
    with open(p.root / "patches/alpha/demo/series", "a") as f:
        f.write("nowhere.patch\n")
    with pytest.raises(UserError, match="listed in the series but missing"):
        manager.apply(up)
    assert any("lists 'nowhere.patch', which does not exist" in x for x in lint(up, {}))


def test_lint_finds_each_problem(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    d = p.root / "patches/alpha/demo"
    first = d / "demo-core-change-greeting.patch"
    text = first.read_text()
    first.write_text(
        text.replace("Patch-Type: bugfix\n", "Patch-Type: hotfix\n")
        .replace("Remove-When: upstream fixes it\n", "")
        .replace("Tested-By: tests/test_demo.py\n", "Tested-By: tests/test_gone.py\n")
        .replace("Why it is needed.", "Why it is needed.  ")
        .rstrip("\n")
    )
    (d / "stray.patch").write_text(text)
    with open(d / "series", "a") as f:
        f.write("demo-util-raise-Y.patch\n")
    problems = "\n".join(lint(up, {}))
    assert "'demo-util-raise-Y.patch' listed twice" in problems
    assert "stray.patch: not listed" in problems
    assert "trailer 'Patch-Type: hotfix' not allowed" in problems
    assert "missing trailer 'Remove-When:'" in problems
    assert "Tested-By: tests/test_gone.py, but test_gone.py does not exist" in problems
    assert "trailing whitespace" in problems
    assert "no newline at the end of the file" in problems


def test_check_one_reports_a_patch_that_does_not_reexport_identically(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    assert check_one(up, {"demo": read_series(up)}) == ([], "")
    path = p.root / "patches/alpha/demo/demo-util-raise-Y.patch"
    text = path.read_text()
    full = text.split("index ")[1].split()[0]  # <pre>..<post>, 40 hex each
    short = "..".join(x[:7] for x in full.split(".."))
    path.write_text(text.replace(full, short))  # as plain `git format-patch` would write it
    manager.apply(up)  # still applies ...
    problems, diff = check_one(up, {"demo": read_series(up)})
    assert any("not byte-identical" in x for x in problems)  # ... but its bytes are not what export makes
    assert f"-index {short}" in diff and f"+index {full}" in diff


def test_rebase_reports_patches_already_upstream(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_R1_SOURCES", "git")
    p = project_with_patch(tmp_path)
    # upstream v2 takes our util.py change and moves hello.py's context
    (p.origin / "util.py").write_text("X = 1\nY = 20\nZ = 3\n")
    (p.origin / "hello.py").write_text(
        "# header\ndef greet():\n    return 'hello'\n\n\ndef other():\n    return 1\n"
    )
    sh(p.origin, "commit", "-qam", "v2: takes the Y change")
    sh(p.origin, "tag", "v2")
    v2 = sh(p.origin, "rev-parse", "HEAD")
    out = rebase.rebase(p.upstream(), "v2")
    assert "already upstream (now empty): demo-util-raise-Y.patch" in out
    up = p.upstream()  # re-read: the pin moved
    assert (up.tag, up.commit) == ("v2", v2)
    assert read_series(up) == ["demo-core-change-greeting.patch"]
    assert sh(p.root, "ls-files", "-s", "third_party/demo").split()[1] == v2
    assert "return 'hi'" in (p.tree / "hello.py").read_text()
    assert check_one(up, {"demo": read_series(up)}) == ([], "")


def test_rebase_stops_at_a_conflict_with_instructions(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_R1_SOURCES", "git")
    p = project_with_patch(tmp_path)
    (p.origin / "util.py").write_text("X = 1\nY = 5\nZ = 3\n")
    sh(p.origin, "commit", "-qam", "v2: conflicting Y")
    sh(p.origin, "tag", "v2")
    with pytest.raises(UserError) as e:
        rebase.rebase(p.upstream(), "v2")
    assert "demo-util-raise-Y.patch conflicts with v2" in str(e.value)
    assert "rebase --stack alpha --continue demo" in str(e.value)
    (p.tree / "util.py").write_text("X = 1\nY = 20\nZ = 3\n")
    sh(p.tree, "add", "util.py")
    g.git(p.tree, "am", "--continue")
    out = rebase.resume(p.upstream())
    assert "rebased onto v2" in out
    assert len(read_series(p.upstream())) == 2


def test_trailers_written_by_the_fixture_are_the_required_ones():
    # guards the fixtures above: if the required set changes, these tests must be revisited
    from tools.patches.series import REQUIRED_TRAILERS

    assert {line.split(":")[0] for line in TRAILERS.splitlines()} == set(REQUIRED_TRAILERS)


def test_rebase_abort_returns_to_the_old_tree(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_R1_SOURCES", "git")
    p = project_with_patch(tmp_path)
    old_head = g.rev(p.tree, "HEAD")
    (p.origin / "util.py").write_text("X = 1\nY = 5\nZ = 3\n")
    sh(p.origin, "commit", "-qam", "v2: conflicting Y")
    sh(p.origin, "tag", "v2")
    with pytest.raises(UserError, match="conflicts with v2"):
        rebase.rebase(p.upstream(), "v2")
    assert "rebase aborted" in rebase.abort(p.upstream())
    assert g.rev(p.tree, "HEAD") == old_head and not g.am_in_progress(p.tree)
    assert p.upstream().commit == p.v1  # the pin did not move
    with pytest.raises(UserError, match="no rebase in progress"):
        rebase.resume(p.upstream())


def test_patch_already_in_the_tree_is_named_as_such(tmp_path):
    p = project_with_patch(tmp_path)
    up = p.upstream()
    manager.unapply(up)
    # the pristine base itself already carries the util.py change
    (p.tree / "util.py").write_text("X = 1\nY = 20\nZ = 3\n")
    sh(p.tree, "commit", "-qam", "base that has the change")
    g.git(p.tree, "update-ref", sources.BASE_REF, "HEAD")
    with pytest.raises(UserError) as e:
        manager.apply(up)
    assert "demo-util-raise-Y.patch does not apply" in str(e.value)
    assert "already applied: the tree already contains this change" in str(e.value)


def test_patch_status_is_a_typed_record_that_the_display_renders(tmp_path):
    p = project_with_patch(tmp_path)  # export leaves the tree stamped as applied
    up = p.upstream()
    st = manager.patch_status(up)
    assert st.ready and st.state is manager.State.APPLIED
    assert (st.applied, st.total, st.dirty, st.base) == (2, 2, False, p.v1) and st.source
    assert manager.status(up)["patches"] == "2/2 applied" and manager.status(up)["tree"] == "clean"
    (p.tree / "hello.py").write_text("an edit\n")
    assert manager.patch_status(up).dirty and manager.status(up)["tree"] == "dirty"
    sh(p.tree, "checkout", "--", "hello.py")
    manager.unapply(up)
    st = manager.patch_status(up)
    assert not st.ready and (st.state, st.applied, st.total, st.on_top) == (manager.State.PRISTINE, 0, 2, 0)
    assert manager.status(up)["patches"] == "0/2 (pristine)"
    manager.apply(up)
    p.commit_in_tree("util.py", "X = 1\nY = 20\nZ = 30\n", subject="demo: util: new work")
    st = manager.patch_status(up)
    assert st.state is manager.State.UNEXPORTED and not st.ready and st.on_top == 3
    assert manager.status(up)["patches"] == "3 commits, not exported (make export-patches)"


def test_patch_status_without_sources(tmp_path):
    p = project_with_patch(tmp_path)
    sh(p.tree, "update-ref", "-d", sources.BASE_REF)
    st = manager.patch_status(p.upstream())
    assert st.state is manager.State.MISSING and not st.ready and st.dirty is None
    assert manager.status(p.upstream()) == {
        "upstream": "demo", "pin": st.pin, "source": "missing", "tree": "-", "patches": "-"
    }  # fmt: skip
