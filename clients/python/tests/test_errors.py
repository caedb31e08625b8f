"""Error mapping and argument checks, against a small HTTP server on loopback
that answers as the control plane does when it refuses a request."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from taskrun import (  # noqa: E402
    APIError,
    Client,
    RateLimitError,
    ServerError,
    TransportError,
    UnsupportedMediaTypeError,
)
from taskrun.errors import error_for_status  # noqa: E402


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/v1/runs/busy/output"):
            body = json.dumps({"error": "too many readers of this run's output: try again later"}).encode()
            self.send_response(429)
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "5")
        elif self.path.startswith("/v1/runs/moved"):
            body = b""
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.2:1/v1/runs/elsewhere")
        elif self.path.startswith("/v1/runs/broken"):
            body = b"<html>oops</html>"
            self.send_response(502)
            self.send_header("Content-Type", "text/html")
        else:
            body = json.dumps({"error": "send the task as application/json"}).encode()
            self.send_response(415)
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class ErrorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        cls.thread = threading.Thread(target=cls.server.serve_forever, daemon=True)
        cls.thread.start()
        cls.client = Client(f"http://127.0.0.1:{cls.server.server_address[1]}", "a-token-of-16-chars")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.shutdown()
        cls.server.server_close()

    def test_rate_limit_carries_retry_after_and_message(self) -> None:
        with self.assertRaises(RateLimitError) as cm:
            self.client.read_output("busy")
        self.assertEqual(cm.exception.status, 429)
        self.assertEqual(cm.exception.retry_after, 5.0)
        self.assertIn("too many readers", cm.exception.message)

    def test_server_error_without_json_uses_the_reason(self) -> None:
        with self.assertRaises(ServerError) as cm:
            self.client.get("broken")
        self.assertEqual(cm.exception.status, 502)
        self.assertEqual(cm.exception.message, "Bad Gateway")

    def test_redirects_are_not_followed(self) -> None:
        with self.assertRaises(APIError) as cm:
            self.client.get("moved")
        self.assertEqual(cm.exception.status, 302)

    def test_other_statuses(self) -> None:
        with self.assertRaises(UnsupportedMediaTypeError) as cm:
            self.client.list_runs()
        self.assertEqual(cm.exception.message, "send the task as application/json")
        self.assertIs(type(error_for_status(418, "teapot")), APIError)

    def test_unreachable_server_is_a_transport_error(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # Nothing listens there now: the connection is refused.
        with self.assertRaises(TransportError):
            Client(f"http://127.0.0.1:{port}", "x" * 16).get("r1")

    def test_bad_arguments(self) -> None:
        with self.assertRaises(ValueError):
            Client("ftp://example.com", "t")
        with self.assertRaises(ValueError):
            Client("http://127.0.0.1:1", "")
        with self.assertRaises(ValueError):
            self.client.get("a/b")
        with self.assertRaises(ValueError):
            list(self.client.follow("r1", -1))


if __name__ == "__main__":
    unittest.main()
