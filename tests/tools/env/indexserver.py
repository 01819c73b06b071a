"""A package index on 127.0.0.1 for the index client's tests: PEP 691 JSON and PEP 503 HTML project pages,
a redirect, 404s and a truncated transfer. Serves only what the test put in `files`."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class IndexServer:
    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.requests: list[str] = []
        # listed hashes per file name; a test may make one lie
        self.listed = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}

    def handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send(self, code: int, body: bytes, ctype: str, length: int | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                server.requests.append(self.path)
                parts = self.path.strip("/").split("/")
                if parts[0] == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "/html/" + "/".join(parts[1:]) + "/")
                    self.end_headers()
                elif parts[0] in ("json", "html") and len(parts) == 3 and parts[1] == "simple":
                    names = [n for n in server.files if n.split("-")[0] == parts[2]]
                    if not names:
                        self.send(404, b"not found", "text/plain")
                    elif parts[0] == "json":
                        files = [
                            {
                                "filename": n,
                                "url": f"../../../files/{n}",
                                "hashes": {"sha256": server.listed[n]},
                            }
                            for n in names
                        ]
                        body = json.dumps({"meta": {"api-version": "1.1"}, "name": parts[2], "files": files})
                        self.send(200, body.encode(), "application/vnd.pypi.simple.v1+json")
                    else:
                        links = "".join(
                            f'<a href="../../../files/{n}#sha256={server.listed[n]}">{n}</a><br/>'
                            for n in names
                        )
                        self.send(200, f"<html><body>{links}</body></html>".encode(), "text/html")
                elif parts[0] == "files" and parts[-1] in server.files:
                    self.send(200, server.files[parts[-1]], "application/octet-stream")
                elif parts[0] == "truncated" and parts[-1] in server.files:
                    data = server.files[parts[-1]]
                    self.send(200, data[: len(data) // 2], "application/octet-stream", length=len(data))
                else:
                    self.send(404, b"not found", "text/plain")

        return Handler


@contextmanager
def serve(files: dict[str, bytes]) -> Iterator[tuple[str, IndexServer]]:
    """(base URL, server) of an index serving `files`; stopped on exit."""
    state = IndexServer(files)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), state.handler())
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    finally:
        httpd.shutdown()
        httpd.server_close()
