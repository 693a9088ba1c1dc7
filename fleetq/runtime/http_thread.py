"""A small HTTP server on a daemon thread, as the worker's health probes (``/readyz``,
``/livez``) and its Prometheus ``/metrics`` are served: beside the asyncio worker, so a
stuck event loop cannot stop a probe from answering. Quiet: probes and scrapes are not
logged.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and answers in one call."""

    def reply(self, code: int, body: str, ctype: str) -> None:
        """Answer ``code`` with ``body`` (UTF-8, of content type ``ctype``)."""
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - probes are noisy
        return


class ServerThread:
    """``handler`` on ``host:port`` (port 0: any free one), served from the daemon thread
    ``name`` once started."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int, host: str,
                 name: str) -> None:
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name,
                                        daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
