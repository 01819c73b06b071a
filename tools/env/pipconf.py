"""Where this machine's pip gets packages: index URL, extra indexes, find-links, certificates, proxy.

Read from pip itself (`python -m pip config list`: the global, user, site and PIP_CONFIG_FILE files and the
PIP_* variables, each with pip's own rules), so the source downloads and the lock resolver use exactly the
indexes that a plain `pip install` on this machine would use. Nothing here names an index host except pip's
documented default, used only when pip is configured with none.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field

PIP_DEFAULT_INDEX = "https://pypi.org/simple"
# later sections override earlier ones; pip's PIP_* variables (the ":env:" variant) override all files
SECTIONS = ("global", "install", "download", ":env:")
LINE = re.compile(r"^(?P<section>[^.]+|:env:)\.(?P<key>[a-z0-9-]+)=(?P<value>.*)$")
ENV_KEYS = {
    "index-url": "PIP_INDEX_URL",
    "extra-index-url": "PIP_EXTRA_INDEX_URL",
    "find-links": "PIP_FIND_LINKS",
    "no-index": "PIP_NO_INDEX",
    "cert": "PIP_CERT",
    "client-cert": "PIP_CLIENT_CERT",
    "proxy": "PIP_PROXY",
    "timeout": "PIP_TIMEOUT",
    "default-timeout": "PIP_DEFAULT_TIMEOUT",
}


@dataclass(frozen=True)
class IndexSettings:
    index_url: str = PIP_DEFAULT_INDEX
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None
    client_cert: str | None = None
    proxy: str | None = None
    timeout: float = 60.0
    origin: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def indexes(self) -> tuple[str, ...]:
        """Every index to look in, in pip's order (the main index first)."""
        return () if self.no_index else (self.index_url, *self.extra_index_urls)

    def describe(self) -> str:
        parts = [*(f"index {u}" for u in self.indexes), *(f"find-links {u}" for u in self.find_links)]
        return ", ".join(parts) or "no index (pip's no-index is set)"

    def index_args(self, *, find_links: bool = True) -> list[str]:
        """The indexes and find-links as command-line options; pip and uv spell them alike."""
        if self.no_index:
            args = ["--no-index"]
        else:
            args = ["--index-url", self.index_url]
            for url in self.extra_index_urls:
                args += ["--extra-index-url", url]
        for link in self.find_links if find_links else ():
            args += ["--find-links", link]
        return args

    def uv_args(self, *, find_links: bool = True) -> list[str]:
        """The same sources for uv, which does not read pip's configuration.

        `unsafe-best-match` makes uv choose among all indexes by version, as pip does; uv's default
        takes a package from the first index that has it at all.
        """
        return [*self.index_args(find_links=find_links), "--index-strategy", "unsafe-best-match"]

    def uv_env(self) -> dict[str, str]:
        env = {"UV_HTTP_TIMEOUT": str(int(self.timeout))}
        if self.cert:
            env["SSL_CERT_FILE"] = self.cert
        if self.client_cert:
            env["SSL_CLIENT_CERT"] = self.client_cert
        if self.proxy:
            env.update(HTTPS_PROXY=self.proxy, HTTP_PROXY=self.proxy)
        return env


def parse_config_list(text: str) -> dict[str, tuple[str, str]]:
    """`pip config list` output -> {key: (value, section)}, the highest-precedence section winning."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        value = m["value"]
        try:
            value = shlex.split(value)[0] if value else ""
        except (ValueError, IndexError):
            value = value.strip("'\"")
        found.setdefault(m["key"], {})[m["section"]] = value
    merged: dict[str, tuple[str, str]] = {}
    for key, by_section in found.items():
        for section in SECTIONS:
            if section in by_section:
                merged[key] = (by_section[section], section)
    return merged


def _from_environment_only() -> dict[str, tuple[str, str]]:
    return {k: (os.environ[v], ":env:") for k, v in ENV_KEYS.items() if os.environ.get(v)}


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def read(python: str = sys.executable) -> IndexSettings:
    """pip's effective index settings on this machine (PIP_* variables only when pip is missing)."""
    try:
        proc = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        )
        merged = parse_config_list(proc.stdout) if proc.returncode == 0 else _from_environment_only()
    except (OSError, subprocess.TimeoutExpired):
        merged = _from_environment_only()
    return settings_from(merged)


def settings_from(merged: dict[str, tuple[str, str]]) -> IndexSettings:
    def get(key: str) -> str | None:
        return merged[key][0] if key in merged else None

    timeout = get("timeout") or get("default-timeout")
    return IndexSettings(
        index_url=(get("index-url") or PIP_DEFAULT_INDEX).rstrip("/"),
        extra_index_urls=tuple(u.rstrip("/") for u in (get("extra-index-url") or "").split()),
        find_links=tuple((get("find-links") or "").split()),
        no_index=_truthy(get("no-index") or ""),
        cert=get("cert"),
        client_cert=get("client-cert"),
        proxy=get("proxy"),
        timeout=float(timeout) if timeout else 60.0,
        origin={k: s for k, (_, s) in merged.items()},
    )
