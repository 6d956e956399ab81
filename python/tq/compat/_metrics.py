"""The Prometheus endpoint ``metrics.enabled`` starts (``GET /metrics``), as the original's
exporter serves it: a small HTTP server on a daemon thread of the process that hosts the
controller (and, under Ray, of each storage unit's actor).

A scrape renders fresh: the request metrics tq's exporter recorded in this process, then (on
the controller) the state gauges computed from a status snapshot taken for that scrape, so a
dropped partition's gauges disappear with it. tq's metric names are its own
(docs/operations.md lists them), not the original's ``tq_controller_*``/``tq_storage_*``.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class Endpoint:
    """Serves ``render()`` on ``http://host:port/metrics`` until :meth:`close` (port 0: a
    free one; :attr:`address` says which)."""

    def __init__(self, render: Callable[[], str], host: str, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if self.path.split("?", 1)[0] != "/metrics":
                    self._answer(404, "not found: try /metrics\n")
                    return
                try:
                    body = render()
                except Exception as e:  # a scrape never breaks the deployment
                    self._answer(500, f"cannot read the metrics: {e}\n")
                    return
                self._answer(200, body, "text/plain; version=0.0.4")

            def _answer(self, status: int, body: str, content_type: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # scrapes are not worth a log line each

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        bound_host, bound_port = self._server.server_address[:2]
        #: ``host:port`` the endpoint answers on (what ``get_metrics_endpoint()`` returns).
        self.address = f"{host}:{bound_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="tq-compat-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
