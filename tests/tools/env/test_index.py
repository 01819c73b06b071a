"""The build-free source download: pip's settings, the index client against a local index, and bootstrap's
use of it (sha256 verification, nothing half-written)."""

from __future__ import annotations

import hashlib
import io
import socket
import tarfile
from pathlib import Path

import pytest

from tests.tools.env.indexserver import serve
from tools.env import index, pipconf
from tools.env.pipconf import IndexSettings
from tools.errors import UserError
from tools.patches import sources
from tools.patches.config import PyPIRelease, Upstream


def sdist(name: str = "demo", version: str = "1.0") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        data = b"X = 1\n"
        info = tarfile.TarInfo(f"{name}-{version}/{name}/__init__.py")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


DEMO = sdist()
DEMO_SHA = hashlib.sha256(DEMO).hexdigest()
OTHER = sdist(version="0.9")


def settings(*indexes: str, find_links: tuple[str, ...] = ()) -> IndexSettings:
    return IndexSettings(
        index_url=indexes[0], extra_index_urls=tuple(indexes[1:]), find_links=find_links, timeout=5
    )


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


@pytest.mark.parametrize("api", ["json", "html", "redirect"])
def test_locates_and_downloads_from_json_html_and_redirected_pages(api, tmp_path):
    with serve({"demo-1.0.tar.gz": DEMO, "demo-0.9.tar.gz": OTHER}) as (base, server):
        s = settings(f"{base}/{api}/simple")
        link = index.locate("Demo", "1.0", DEMO_SHA, s)
        assert link.filename == "demo-1.0.tar.gz" and link.sha256 == DEMO_SHA
        assert link.url == f"{base}/files/demo-1.0.tar.gz"  # relative URL resolved against the final page
        path = index.fetch(link, tmp_path / link.filename, s)
    assert index.verified(path, DEMO_SHA, "test").read_bytes() == DEMO


def test_json_is_asked_for_first():
    with serve({"demo-1.0.tar.gz": DEMO}) as (base, _):
        client = index.Client(settings(f"{base}/json/simple"))
        with client.open(f"{base}/json/simple/demo/", index.ACCEPT) as resp:
            assert resp.headers["Content-Type"] == "application/vnd.pypi.simple.v1+json"
    assert index.ACCEPT.startswith("application/vnd.pypi.simple.v1+json")


def test_a_404_index_is_skipped_for_the_next_one():
    with serve({"demo-1.0.tar.gz": DEMO}) as (base, server):
        link = index.locate(
            "demo", "1.0", DEMO_SHA, settings(f"{base}/nothing/simple", f"{base}/json/simple")
        )
    assert link.sha256 == DEMO_SHA
    assert server.requests[0] == "/nothing/simple/demo/"


def test_a_truncated_transfer_is_an_error_and_leaves_nothing(tmp_path):
    with serve({"demo-1.0.tar.gz": DEMO}) as (base, _):
        link = index.FileLink("demo-1.0.tar.gz", f"{base}/truncated/demo-1.0.tar.gz", DEMO_SHA)
        with pytest.raises(UserError, match=r"transfer ended after \d+ of \d+ bytes"):
            index.fetch(link, tmp_path / link.filename, settings(base))
    assert list(tmp_path.iterdir()) == []


def test_a_listed_hash_other_than_the_pin_is_refused_but_a_matching_index_wins():
    with serve({"demo-1.0.tar.gz": DEMO}) as (base, server):
        server.listed["demo-1.0.tar.gz"] = "0" * 64
        with pytest.raises(UserError, match="not the pinned " + DEMO_SHA):
            index.locate("demo", "1.0", DEMO_SHA, settings(f"{base}/json/simple"))
    with serve({"demo-1.0.tar.gz": DEMO}) as (good, _), serve({"demo-1.0.tar.gz": DEMO}) as (bad, bad_server):
        bad_server.listed["demo-1.0.tar.gz"] = "0" * 64
        link = index.locate("demo", "1.0", DEMO_SHA, settings(f"{bad}/json/simple", f"{good}/html/simple"))
    assert link.url.startswith(good)


def test_file_index_and_find_links_folders(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    (files / "demo-1.0.tar.gz").write_bytes(DEMO)
    page = tmp_path / "simple" / "demo"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="../../files/demo-1.0.tar.gz#sha256={DEMO_SHA}">x</a>')
    s = settings((tmp_path / "simple").as_uri())
    link = index.locate("demo", "1.0", DEMO_SHA, s)
    assert link.sha256 == DEMO_SHA and link.url == (files / "demo-1.0.tar.gz").as_uri()
    assert index.fetch(link, tmp_path / "out.tar.gz", s).read_bytes() == DEMO
    # a plain find-links folder: no hash listed, verified after download
    s = settings((tmp_path / "empty").as_uri(), find_links=(str(files),))
    link = index.locate("demo", "1.0", DEMO_SHA, s)
    assert link.sha256 is None and link.filename == "demo-1.0.tar.gz"


def test_missing_release_names_what_was_tried_and_what_exists():
    with serve({"demo-0.9.tar.gz": OTHER}) as (base, _), pytest.raises(UserError) as e:
        index.locate("demo", "1.0", None, settings(f"{base}/json/simple"))
    msg = str(e.value)
    assert "no source archive of demo==1.0" in msg and f"{base}/json/simple/demo/" in msg
    assert "versions found: 0.9" in msg


def test_no_reachable_index_names_the_urls_and_how_to_set_a_mirror():
    url = closed_port_url()
    with pytest.raises(UserError) as e:
        index.locate("demo", "1.0", None, settings(url))
    msg = str(e.value)
    assert "no package index could be reached" in msg and f"{url}/demo/" in msg
    assert "pip config set global.index-url" in msg and "PIP_INDEX_URL" in msg


def test_pip_settings_precedence_and_uv_arguments():
    text = "\n".join(
        [
            "global.index-url='https://global.example/simple'",
            "global.extra-index-url='file:///a/simple file:///b/simple'",
            "install.index-url='https://install.example/simple'",
            ":env:.find-links='/opt/wheels'",
            "global.find-links='/ignored'",
            "global.cert='/etc/ca.pem'",
        ]
    )
    s = pipconf.settings_from(pipconf.parse_config_list(text))
    assert s.index_url == "https://install.example/simple"
    assert s.extra_index_urls == ("file:///a/simple", "file:///b/simple")
    assert s.find_links == ("/opt/wheels",) and s.cert == "/etc/ca.pem"
    args = s.uv_args()
    assert args[:2] == ["--index-url", "https://install.example/simple"]
    assert args.count("--extra-index-url") == 2 and args[6:8] == ["--find-links", "/opt/wheels"]
    assert args[-2:] == ["--index-strategy", "unsafe-best-match"]
    assert "--find-links" not in s.uv_args(find_links=False) and s.index_args() == args[:-2]
    assert s.uv_env()["SSL_CERT_FILE"] == "/etc/ca.pem"


def test_pips_own_configuration_is_read(tmp_path, monkeypatch):
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://mirror.invalid/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    assert pipconf.read().index_url == "https://mirror.invalid/simple"
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.invalid/simple")
    assert pipconf.read().index_url == "https://env.invalid/simple"  # pip: variables beat files


@pytest.fixture
def demo_upstream(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_R1_SOURCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sources, "REPO", tmp_path)
    return Upstream(
        name="demo",
        path=Path("third_party/demo"),
        url="https://example.invalid/demo.git",
        tag="v1.0",
        commit="1" * 40,
        pypi=PyPIRelease("demo", "1.0", DEMO_SHA),
        root=tmp_path,
    )


def test_bootstrap_sources_come_from_the_index_pip_is_configured_with(demo_upstream, tmp_path, monkeypatch):
    with serve({"demo-1.0.tar.gz": DEMO}) as (base, server):
        monkeypatch.setattr(pipconf, "read", lambda: settings(f"{base}/json/simple"))
        sources.from_pypi(demo_upstream)
        assert (demo_upstream.tree / "demo/__init__.py").read_text() == "X = 1\n"
        assert (tmp_path / "cache" / "demo-1.0.tar.gz").exists()
        sources.download(demo_upstream)  # cached: no second request
        assert server.requests.count("/files/demo-1.0.tar.gz") == 1


def test_a_served_file_that_differs_from_the_pin_is_moved_aside(demo_upstream, tmp_path, monkeypatch):
    with serve({"demo-1.0.tar.gz": OTHER}) as (base, server):
        server.listed["demo-1.0.tar.gz"] = DEMO_SHA  # the index lies about the hash
        monkeypatch.setattr(pipconf, "read", lambda: settings(f"{base}/html/simple"))
        with pytest.raises(UserError, match="does not match " + DEMO_SHA):
            sources.download(demo_upstream)
    assert (tmp_path / "cache" / "demo-1.0.tar.gz.corrupt").exists()
    assert not (tmp_path / "cache" / "demo-1.0.tar.gz").exists()
