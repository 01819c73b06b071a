"""Hash locks: freshness against their inputs, the repository's own locks, and the sync that refuses a
distribution whose hash does not match (real uv, a local find-links folder, no network)."""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools import stacks
from tools.env import lock, pipconf, requirements
from tools.env.pipconf import IndexSettings
from tools.errors import UserError

NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def test_the_repository_locks_are_current():
    for spec in lock.SPECS.values():
        assert lock.staleness(spec) is None, f"{spec.path}: run `make lock`"


@pytest.mark.parametrize("name", [n for n, s in lock.SPECS.items() if s.install])
def test_every_requirement_is_pinned_with_hashes_in_its_lock(name):
    spec = lock.SPECS[name]
    text = (lock.REPO / spec.path).read_text()
    pinned = {m[1].lower().replace("_", "-") for m in re.finditer(r"^([A-Za-z0-9._-]+)==\S+ \\$", text, re.M)}
    entries = re.findall(
        r"^[A-Za-z0-9._-]+==\S+(?: ; [^\\]+)? \\\n(?:    --hash=sha256:[0-9a-f]{64}.*\n)+", text, re.M
    )
    assert len(entries) == len(pinned) > 10  # every entry carries at least one hash
    for path in lock.input_files(spec):
        if spec.excludes and path == (lock.REPO / spec.excludes).resolve():
            continue  # what the lock must NOT hold
        for line in path.read_text().splitlines():
            line = line.split("#")[0].strip()
            if not line or line.startswith("-"):
                continue
            name = NAME.match(line)[1].lower().replace("_", "-").split("[")[0]
            assert name in pinned, f"{path.name}: {name} is not in {spec.path}"
    assert "apex==" not in text  # the PyPI 'apex' is unrelated to NVIDIA/Ascend apex
    if spec.excludes:
        for line in (lock.REPO / spec.excludes).read_text().splitlines():
            name = line.split("#")[0].strip()
            assert not name or name not in pinned, f"{spec.excludes} names {name}, but {spec.path} has it"


@pytest.mark.parametrize("stack", list(stacks.load()))
def test_cpu_lock_takes_the_cpu_build_of_torch_and_npu_the_stacks_npu_pair(stack):
    cpu = (lock.REPO / f"locks/{stack}/cpu.txt").read_text()
    assert re.search(r"^torch==2\.13\.0\+cpu ", cpu, re.M)
    assert not re.search(r"^(nvidia-|torchvision==|torchaudio==|torchcodec==)", cpu, re.M)
    want = stacks.load()[stack].npu
    npu = (lock.REPO / f"locks/{stack}/npu.txt").read_text()
    assert re.search(rf"^torch=={re.escape(want['torch'])} ", npu, re.M)
    assert re.search(rf"^torch-npu=={re.escape(want['torch-npu'])} ", npu, re.M)


def make_root(tmp_path: Path) -> tuple[Path, lock.LockSpec]:
    (tmp_path / "requirements.txt").write_text("demo>=1\n")
    (tmp_path / "requirements-x.txt").write_text("-r requirements.txt\nother==2\n")
    spec = lock.LockSpec("x", ("requirements-x.txt",), "x86_64-manylinux_2_28")
    return tmp_path, spec


def write_lock(root: Path, spec: lock.LockSpec, body: str) -> None:
    (root / "locks").mkdir(exist_ok=True)
    (root / spec.path).write_text(lock.header(spec, lock.inputs_digest(spec, root)) + body)


def test_a_lock_older_than_an_included_file_is_stale(tmp_path):
    root, spec = make_root(tmp_path)
    assert "missing" in lock.staleness(spec, root)
    write_lock(root, spec, "demo==1.0\n")
    assert lock.staleness(spec, root) is None
    (root / "requirements.txt").write_text("demo>=2\n")  # changed through -r
    why = lock.staleness(spec, root)
    assert why.startswith("locks/x.txt is older than its inputs")
    with pytest.raises(UserError, match="make lock"):
        lock.check_fresh(spec, root)
    other = lock.LockSpec("x", spec.inputs, "aarch64-manylinux_2_28")  # the resolver settings count too
    assert lock.inputs_digest(other, root) != lock.inputs_digest(spec, root)


def test_a_comment_edit_leaves_the_lock_current_and_a_requirement_edit_does_not(tmp_path):
    root, spec = make_root(tmp_path)
    write_lock(root, spec, "demo==1.0\nother==2\n")
    (root / "requirements-x.txt").write_text(
        "# the moved path's name, corrected\n-r requirements.txt\n\nother==2   # why: a comment after a pin\n"
    )
    assert lock.staleness(spec, root) is None
    for edit in (
        "other==3\n",
        "-r requirements.txt\nother==2#no-space-is-not-a-comment\n",
        "-r requirements.txt\n",
    ):
        (root / "requirements-x.txt").write_text(edit)
        assert lock.staleness(spec, root), edit


def test_a_relock_names_each_version_it_changed(tmp_path):
    (tmp_path / "before.txt").write_text("# header\nDemo==1.0 \\\n    --hash=sha256:00\ngone==1\nsame==2\n")
    (tmp_path / "after.txt").write_text("demo==1.1 \\\n    --hash=sha256:11\nsame==2\nnew==0.1\n")
    before, after = requirements.locked(tmp_path / "before.txt"), requirements.locked(tmp_path / "after.txt")
    assert before == {"demo": "1.0", "gone": "1", "same": "2"}
    assert lock.version_changes(before, after) == ["demo 1.0 -> 1.1", "gone 1 removed", "new 0.1 added"]
    assert lock.version_changes(after, after) == []


def test_a_python_the_lock_was_not_made_for_is_refused():
    with pytest.raises(UserError) as e:
        lock.check_python(lock.SPECS["published/cpu"], (3, 12))
    assert "made for Python 3.11" in str(e.value) and "SYSPY=python3.11" in str(e.value)
    lock.check_python(lock.SPECS["published/cpu"], (3, 11))


def test_a_missing_venv_module_names_the_debian_package(tmp_path, monkeypatch):
    fake = tmp_path / "python3"
    fake.write_text(
        "#!/bin/sh\necho 'The virtual environment was not created successfully because ensurepip is not"
        " available.' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    with pytest.raises(UserError, match=r"apt-get install python3\.\d+-venv"):
        lock.make_venv(tmp_path / "venv", with_pip=False)


def wheel(folder: Path, name: str = "demo", version: str = "1.0") -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for n, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{n},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
    return path


@pytest.mark.slow
def test_sync_installs_exactly_the_lock_and_refuses_a_hash_mismatch(tmp_path, monkeypatch):
    links = tmp_path / "links"
    links.mkdir()
    good = hashlib.sha256(wheel(links).read_bytes()).hexdigest()
    other = hashlib.sha256(wheel(links, "other").read_bytes()).hexdigest()
    root = tmp_path / "root"
    (root / "locks").mkdir(parents=True)
    (root / "requirements").mkdir()
    for name in ("requirements/bootstrap.txt", "locks/bootstrap.txt"):  # the real, pinned uv
        (root / name).write_text((lock.REPO / name).read_text())
    (root / "requirements/build.txt").write_text("")
    (root / "requirements-x.txt").write_text("demo\n")
    spec = lock.LockSpec("x", ("requirements-x.txt",), "x86_64-manylinux_2_28")
    write_lock(root, lock.SPECS["build"], "")
    lock.ensure_uv(root)  # from the real index, before the test's index-less settings
    monkeypatch.setattr(pipconf, "read", lambda: IndexSettings(no_index=True, find_links=(str(links),)))
    venv = tmp_path / "venv"
    lock.make_venv(venv, with_pip=False)
    python = venv / "bin" / "python"

    def installed() -> str | None:
        code = "import demo; print(demo.VALUE)"
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tmp_path)
        return out.stdout.strip() if out.returncode == 0 else None

    write_lock(root, spec, f"demo==1.0 \\\n    --hash=sha256:{'0' * 64}\n")
    with pytest.raises(UserError, match="installing locks/x.txt failed"):
        lock.sync(spec, python, root)
    assert installed() is None

    write_lock(root, spec, f"demo==1.0 \\\n    --hash=sha256:{good}\n")
    lock.sync(spec, python, root)
    assert installed() == "42"

    # nothing extra: what the lock no longer names is removed
    write_lock(root, spec, f"other==1.0 \\\n    --hash=sha256:{other}\n")
    lock.sync(spec, python, root)
    assert installed() is None


def test_a_lock_for_another_architecture_is_refused_in_one_line() -> None:
    from tools.env import lock
    from tools.errors import UserError

    lock.check_machine(lock.SPECS["current/cpu"], "x86_64")
    with pytest.raises(UserError) as e:
        lock.check_machine(lock.SPECS["current/cpu"], "aarch64")
    assert "locks/current/cpu.txt is resolved for x86_64, and this machine is aarch64" in str(e.value)
    assert (
        "no stack's cpu profile is locked for aarch64 (torch 2.13.0's CPU build is served for x86_64 only)"
        in str(e.value)
    )


def test_a_relock_keeps_every_locked_version_unless_asked_to_upgrade(tmp_path, monkeypatch):
    """`make lock` after an edit that allows what the lock has (a new bound) keeps the lock's versions: uv reads
    the existing lock as its preferences; `make lock UPGRADE=1` takes the newest the inputs allow (real uv,
    a local find-links folder with demo 1.0 and 2.0, no network)."""
    links = tmp_path / "links"
    links.mkdir()
    wheel(links, version="1.0"), wheel(links, version="2.0")
    root = tmp_path / "root"
    (root / "locks").mkdir(parents=True)
    (root / "requirements").mkdir()
    for name in ("requirements/bootstrap.txt", "locks/bootstrap.txt"):  # the real, pinned uv
        (root / name).write_text((lock.REPO / name).read_text())
    (root / "requirements-x.txt").write_text("demo\n")
    spec = lock.LockSpec("x", ("requirements-x.txt",), "x86_64-manylinux_2_28")
    lock.ensure_uv(root)  # from the real index, before the test's index-less settings
    monkeypatch.setattr(pipconf, "read", lambda: IndexSettings(no_index=True, find_links=(str(links),)))

    def locked() -> list[str]:
        return re.findall(r"^demo==(\S+)", (root / spec.path).read_text(), re.M)

    lock.compile_lock(spec, root)
    assert locked() == ["2.0"]  # no lock yet: the newest
    one = hashlib.sha256((links / "demo-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    write_lock(root, spec, f"demo==1.0 \\\n    --hash=sha256:{one}\n")  # locked earlier, at 1.0
    (root / "requirements-x.txt").write_text("demo<3\n")
    assert lock.staleness(spec, root)
    lock.compile_lock(spec, root)
    assert locked() == ["1.0"] and lock.staleness(spec, root) is None  # kept, and current again
    lock.compile_lock(spec, root, upgrade=True)
    assert locked() == ["2.0"]
