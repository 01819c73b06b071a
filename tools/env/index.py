"""Find and download one release file from a package index, without building or importing anything.

The index API is the standard one: PEP 691 JSON (`application/vnd.pypi.simple.v1+json`) with PEP 503 HTML
as the fallback; hashes come from the JSON `hashes` or the `#sha256=` URL fragment. Indexes may be https
or `file://` folders (a project page is `<project>/index.html` there), and find-links may be plain folders
or pages of links, as pip allows. Redirects are followed; a 404 means "not on this index".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from tools import atomic
from tools.env.pipconf import IndexSettings
from tools.errors import UserError

ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
SDIST_SUFFIXES = (".tar.gz", ".zip")


class IndexLookupError(UserError):
    """A release file could not be found or fetched."""


@dataclass(frozen=True)
class FileLink:
    filename: str
    url: str
    sha256: str | None = None


def normalize(name: str) -> str:
    """PEP 503 project name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sdist_of(filename: str) -> tuple[str, str] | None:
    """(normalised name, version) of an sdist file name, else None."""
    for suffix in SDIST_SUFFIXES:
        if filename.endswith(suffix):
            stem = filename[: -len(suffix)]
            name, sep, version = stem.rpartition("-")
            return (normalize(name), version) if sep else None
    return None


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def parse_page(body: bytes, content_type: str, base_url: str) -> list[FileLink]:
    """The files listed on a project page (JSON or HTML), with absolute URLs."""
    if "json" in content_type:
        data = json.loads(body)
        return [
            FileLink(
                f["filename"], urllib.parse.urljoin(base_url, f["url"]), f.get("hashes", {}).get("sha256")
            )
            for f in data.get("files", [])
        ]
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    files = []
    for href, text in parser.links:
        url, _, fragment = urllib.parse.urljoin(base_url, href).partition("#")
        sha = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
        name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1]) or text
        files.append(FileLink(name, url, sha))
    return files


class Client:
    """HTTP(S) and file:// access with pip's certificate, proxy and timeout settings."""

    def __init__(self, settings: IndexSettings):
        self.settings = settings
        context = ssl.create_default_context(cafile=settings.cert) if settings.cert else None
        if context and settings.client_cert:
            context.load_cert_chain(settings.client_cert)
        handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPSHandler(context=context)]
        if settings.proxy:
            handlers.append(urllib.request.ProxyHandler({"http": settings.proxy, "https": settings.proxy}))
        self.opener = urllib.request.build_opener(*handlers)

    def open(self, url: str, accept: str = "*/*"):
        request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "ascend-r1"})
        return self.opener.open(request, timeout=self.settings.timeout)

    def project_files(self, index: str, project: str) -> list[FileLink]:
        """Files of `project` on one index; [] when the index does not have it (404 / no folder)."""
        url = f"{index.rstrip('/')}/{normalize(project)}/"
        if url.startswith("file:"):
            folder = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
            page = folder / "index.html"
            if not page.is_file():
                return []
            return parse_page(page.read_bytes(), "text/html", page.as_uri())
        try:
            with self.open(url, ACCEPT) as resp:
                return parse_page(resp.read(), resp.headers.get("Content-Type", ""), resp.geturl())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise

    def find_links_files(self, location: str) -> list[FileLink]:
        """Files offered by one find-links location: a folder, a file:// folder or a page of links."""
        if "://" not in location or location.startswith("file:"):
            folder = Path(
                urllib.request.url2pathname(urllib.parse.urlsplit(location).path)
                if location.startswith("file:")
                else location
            )
            if folder.is_dir():
                return [FileLink(p.name, p.as_uri()) for p in sorted(folder.iterdir()) if p.is_file()]
            if folder.is_file():
                return parse_page(folder.read_bytes(), "text/html", folder.as_uri())
            return []
        with self.open(location, "text/html") as resp:
            return parse_page(resp.read(), resp.headers.get("Content-Type", ""), resp.geturl())


def locate(project: str, version: str, sha256: str | None, settings: IndexSettings) -> FileLink:
    """The sdist of `project==version` on the configured indexes and find-links.

    With `sha256`, a listed file whose hash differs is passed over for one that matches (a file without a
    listed hash is verified after download)."""
    client = Client(settings)
    want = (normalize(project), version)
    tried: list[str] = []
    failures: list[str] = []
    seen_versions: set[str] = set()
    candidates: list[FileLink] = []
    sources = [("index", u) for u in settings.indexes] + [("find-links", u) for u in settings.find_links]
    for kind, location in sources:
        where = f"{location.rstrip('/')}/{normalize(project)}/" if kind == "index" else location
        tried.append(where)
        try:
            files = (
                client.project_files(location, project)
                if kind == "index"
                else client.find_links_files(location)
            )
        except (urllib.error.URLError, OSError, ValueError) as e:
            failures.append(f"{where}: {getattr(e, 'reason', e)}")
            continue
        for f in files:
            parsed = sdist_of(f.filename)
            if parsed is None or parsed[0] != want[0]:
                continue
            seen_versions.add(parsed[1])
            if parsed[1] == version:
                candidates.append(f)
    if candidates:
        exact = [c for c in candidates if sha256 and c.sha256 == sha256]
        unknown = [c for c in candidates if c.sha256 is None]
        listed_other = [c for c in candidates if sha256 and c.sha256 not in (None, sha256)]
        if exact or unknown or not sha256:
            return (exact or unknown or candidates)[0]
        raise IndexLookupError(
            f"{project}=={version}: the index lists {listed_other[0].filename} with sha256 "
            f"{listed_other[0].sha256}, not the pinned {sha256}",
            fix="check the sha256 in patches/upstreams.toml against the release on PyPI; a mirror that"
            " serves a different file is misconfigured",
        )
    if failures and len(failures) == len(sources):
        raise IndexLookupError(
            f"no package index could be reached for {project}=={version}; tried: " + "; ".join(failures),
            fix="check the network, or point pip at a mirror: `pip config set global.index-url "
            "<mirror>/simple` (or PIP_INDEX_URL); bootstrap reads pip's configuration",
        )
    versions = ", ".join(sorted(seen_versions)[-8:]) or "none"
    detail = (" (unreachable: " + "; ".join(failures) + ")") if failures else ""
    raise IndexLookupError(
        f"no source archive of {project}=={version} on the configured indexes (looked in "
        f"{', '.join(tried)}; versions found: {versions}){detail}",
        fix="check the version in patches/upstreams.toml, or add an index that has it (pip config)",
    )


def _progress(name: str, done: int, total: int | None, start: float, final: bool = False) -> None:
    rate = done / max(time.monotonic() - start, 1e-6) / 1e6
    size = f"{done / 1e6:.1f}/{total / 1e6:.1f} MB" if total else f"{done / 1e6:.1f} MB"
    end = "\n" if final or not sys.stderr.isatty() else ""
    sys.stderr.write(f"\r  downloading {name}: {size} ({rate:.1f} MB/s){end}")
    sys.stderr.flush()


def fetch(link: FileLink, dest: Path, settings: IndexSettings) -> Path:
    """Download `link` to `dest` (atomically; a truncated transfer is an error, nothing half-written)."""
    client = Client(settings)
    start = time.monotonic()
    try:
        with client.open(link.url) as resp, atomic.atomic_path(dest) as tmp, open(tmp, "wb") as out:
            total = int(resp.headers["Content-Length"]) if resp.headers.get("Content-Length") else None
            done, last = 0, start
            while block := resp.read(1 << 20):
                out.write(block)
                done += len(block)
                if time.monotonic() - last > (0.2 if sys.stderr.isatty() else 5.0):
                    _progress(link.filename, done, total, start)
                    last = time.monotonic()
            if total is not None and done != total:
                raise IndexLookupError(
                    f"{link.url}: transfer ended after {done} of {total} bytes",
                    fix="run the command again; if it keeps failing, the index or a proxy is cutting it",
                )
            out.flush()
            _progress(link.filename, done, total, start, final=True)
    except (urllib.error.URLError, OSError) as e:
        raise IndexLookupError(
            f"{link.url}: download failed: {getattr(e, 'reason', e)}",
            fix="check the network or the mirror in pip's configuration, then run the command again",
        ) from None
    return dest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified(path: Path, expected: str, what: str) -> Path:
    """`path` when its sha256 is `expected`; otherwise move it aside as `.corrupt` and raise."""
    actual = sha256_file(path)
    if actual != expected:
        bad = path.with_name(path.name + ".corrupt")
        os.replace(path, bad)
        raise IndexLookupError(
            f"{path}: sha256 {actual} does not match {expected} ({what})."
            f" The archive is corrupt or truncated; it was moved to {bad.name}",
            fix="run `make bootstrap` again to download it afresh; if it fails again, compare the sha256 in"
            " upstreams.toml with the one PyPI lists for the release",
        )
    return path
