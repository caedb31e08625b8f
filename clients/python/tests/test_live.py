"""The Python client against a real control plane and worker.

clients/clients_test.go (``go test ./clients``) starts ``taskrun serve`` and
``taskrun worker`` on loopback and runs these tests with:

- TASKRUN_URL: the control plane;
- TASKRUN_TOKEN, TASKRUN_OTHER_TOKEN: the tokens of two users;
- TASKRUN_WORKER_TOKEN: the worker's token (refused on the user API);
- TASKRUN_TEST_IMAGE: the image the worker offers (busybox sh in it);
- TASKRUN_CLIENT_RUN_LOG: a file each submitted run's ID is appended to, so
  the harness can check no container of them is left.

Without TASKRUN_URL they are skipped.
"""

from __future__ import annotations

import io
import os
import socket
import sys
import tarfile
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import taskrun  # noqa: E402
from taskrun import (  # noqa: E402
    AuthenticationError,
    BadRequestError,
    Client,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    WaitTimeoutError,
)

URL = os.environ.get("TASKRUN_URL", "")

# What the run prints, in three pieces a second apart: a line, bytes that are
# not UTF-8, and a tail without a newline.
EXPECTED = b"first line\nbin:\xff\x01 end\nno newline"
SCRIPT = r"printf 'first line\n'; sleep 1; printf 'bin:\377\001 end\n'; sleep 1; printf 'no newline'"


class CuttingProxy:
    """A TCP proxy on loopback to the control plane that cuts every
    connection ``life`` seconds after it was opened."""

    def __init__(self, upstream: str, life: float) -> None:
        u = urllib.parse.urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.life = life
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            server = socket.create_connection(self.upstream)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()
            timer = threading.Timer(self.life, self._cut, args=(client, server))
            timer.daemon = True
            timer.start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    @staticmethod
    def _cut(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()


@unittest.skipUnless(URL, "TASKRUN_URL is not set: run through go test ./clients, which starts serve and a worker")
class LiveTest(unittest.TestCase):
    """Each test submits real runs executed in real containers."""

    client: Client
    other: Client
    image: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = Client(URL, os.environ["TASKRUN_TOKEN"])
        cls.other = Client(URL, os.environ["TASKRUN_OTHER_TOKEN"])
        cls.image = os.environ["TASKRUN_TEST_IMAGE"]

    def submit(self, script: str, **kw: object) -> str:
        sub = self.client.submit("python client test", image=self.image, runtime="runc",
                                 command=["sh", "-c", script], **kw)  # type: ignore[arg-type]
        self.assertEqual(sub.status, "QUEUED")
        log = os.environ.get("TASKRUN_CLIENT_RUN_LOG")
        if log:
            with open(log, "a") as f:
                f.write(sub.run_id + "\n")
        return sub.run_id

    def test_follow_gives_the_exact_output_and_the_run_succeeds(self) -> None:
        run_id = self.submit(SCRIPT)
        chunks = list(self.client.follow(run_id))
        got = b"".join(c.data for c in chunks)
        self.assertEqual(got, EXPECTED)
        self.assertEqual(chunks[0].offset, 0)
        for prev, cur in zip(chunks, chunks[1:]):
            self.assertEqual(cur.offset, prev.end, "pieces are contiguous")

        run = self.client.wait(run_id, timeout=120)
        self.assertEqual(run.status, "SUCCEEDED", run.error)
        self.assertTrue(run.terminal)
        self.assertEqual(run.exit_code, 0)
        self.assertEqual(run.stream_next, len(EXPECTED))
        self.assertTrue(run.stream_ended)
        self.assertEqual(run.prompt, "python client test")
        self.assertIsNotNone(run.ended_at)

        # Resuming at an offset gives exactly the rest.
        self.assertEqual(self.client.read_output(run_id, 11), EXPECTED[11:])
        self.assertEqual(b"".join(c.data for c in self.client.follow(run_id, 16)), EXPECTED[16:])
        self.assertEqual(self.client.read_output(run_id, len(EXPECTED)), b"")

        listed = self.client.list_runs(status="SUCCEEDED", limit=500)
        self.assertIn(run_id, [r.id for r in listed])
        self.assertTrue(all(r.status == "SUCCEEDED" for r in listed))
        self.assertEqual(self.client.list_runs(limit=1)[0].status in taskrun.STATUSES, True)

    def test_follow_resumes_after_the_connection_drops(self) -> None:
        run_id = self.submit("for i in 1 2 3 4; do echo line $i; sleep 1; done")
        proxy = CuttingProxy(URL, life=1.5)
        self.addCleanup(proxy.close)
        cut = Client(proxy.url, os.environ["TASKRUN_TOKEN"])
        got = b"".join(c.data for c in cut.follow(run_id, max_reconnects=10))
        self.assertEqual(got, b"line 1\nline 2\nline 3\nline 4\n")
        self.assertGreater(proxy.connections, 1, "the follow was cut and resumed")
        self.assertEqual(self.client.wait(run_id, timeout=120).status, "SUCCEEDED")

    def test_workspace_is_uploaded(self) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            data = b"hello from the workspace\n"
            info = tarfile.TarInfo("greeting.txt")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tf.addfile(info, io.BytesIO(data))
        run_id = self.submit('cat "$HOME/greeting.txt"', workspace=buf.getvalue())
        run = self.client.wait(run_id, timeout=120)
        self.assertEqual(run.status, "SUCCEEDED", run.error)
        self.assertEqual(self.client.read_output(run_id), b"hello from the workspace\n")
        ws = run.raw["spec"]["workspace"]
        self.assertEqual(ws["size"], len(buf.getvalue()))

    def test_the_runs_record_and_patch(self) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            data = b"old\n"
            info = tarfile.TarInfo("notes.txt")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tf.addfile(info, io.BytesIO(data))
        run_id = self.submit('echo new > "$HOME/notes.txt"', workspace=buf.getvalue())
        self.assertEqual(self.client.wait(run_id, timeout=120).status, "SUCCEEDED")
        deadline = time.monotonic() + 30
        while True:  # the worker stores the record as the run ends
            try:
                record = self.client.record(run_id)
                break
            except NotFoundError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.assertEqual(record["run_id"], run_id)
        self.assertEqual(record["status"], "SUCCEEDED")
        patch = self.client.patch(run_id)
        self.assertIn(b"-old\n+new\n", patch)
        self.assertEqual(self.client.changes(run_id)["summary"]["modified"], 1)
        self.assertEqual(self.client.file(run_id, "home/notes.txt"), b"new\n")
        with self.assertRaises(ValueError):
            self.client.file(run_id, "../other/changes.json")
        with self.assertRaises(NotFoundError):
            self.other.patch(run_id)

    def test_another_tenant_gets_not_found(self) -> None:
        run_id = self.submit("echo mine")
        for call in (
            lambda: self.other.get(run_id),
            lambda: self.other.cancel(run_id),
            lambda: self.other.read_output(run_id),
            lambda: list(self.other.follow(run_id)),
        ):
            with self.assertRaises(NotFoundError) as cm:
                call()
            self.assertEqual(cm.exception.status, 404)
            self.assertTrue(cm.exception.message)
        self.assertNotIn(run_id, [r.id for r in self.other.list_runs(limit=500)])
        # The owner still sees it, untouched by the other's cancel.
        run = self.client.wait(run_id, timeout=120)
        self.assertEqual(run.status, "SUCCEEDED", run.error)
        with self.assertRaises(NotFoundError):
            self.client.get("r-no-such-run")

    def test_cancel_a_long_run(self) -> None:
        run_id = self.submit("echo started; sleep 300")
        with self.assertRaises(WaitTimeoutError) as cm:
            self.client.wait(run_id, timeout=0.5, poll_interval=0.1)
        self.assertIsNotNone(cm.exception.run)
        self.assertIn(cm.exception.run.status, ("QUEUED", "RUNNING"))
        # Wait until it runs (its first line is out), then cancel.
        stream = self.client.follow(run_id)
        first = next(stream)
        stream.close()
        self.assertTrue(b"started\n".startswith(first.data), first.data)
        run = self.client.cancel(run_id)
        self.assertEqual(run.id, run_id)
        self.assertTrue(run.cancel_requested or run.status == "CANCELLED")
        run = self.client.wait(run_id, timeout=120, poll_interval=0.2)
        self.assertEqual(run.status, "CANCELLED")
        with self.assertRaises(ConflictError) as cc:
            self.client.cancel(run_id)
        self.assertEqual(cc.exception.status, 409)

    def test_cancel_queued_and_running_runs(self) -> None:
        # Far more than the worker's slots: the last ones wait in the queue.
        ids = [self.submit("sleep 300") for _ in range(4)]
        for run_id in reversed(ids):
            self.client.cancel(run_id)
        for run_id in ids:
            self.assertEqual(self.client.wait(run_id, timeout=120, poll_interval=0.2).status, "CANCELLED")

    def test_bad_token_is_an_authentication_error(self) -> None:
        bad = Client(URL, "not-a-token-of-this-server")
        with self.assertRaises(AuthenticationError) as cm:
            bad.list_runs()
        self.assertEqual(cm.exception.status, 401)
        self.assertEqual(cm.exception.message, "missing or unknown bearer token")
        with self.assertRaises(AuthenticationError):
            bad.submit("hi")
        worker = Client(URL, os.environ["TASKRUN_WORKER_TOKEN"])
        with self.assertRaises(PermissionDeniedError) as pd:
            worker.list_runs()
        self.assertEqual(pd.exception.status, 403)
        self.assertIn("worker token is refused", pd.exception.message)

    def test_workers_are_listed(self) -> None:
        workers = self.client.workers()
        self.assertEqual(len(workers), 1, workers)
        self.assertEqual(workers[0]["capacity"]["slots"], 2)
        self.assertIn(self.image, workers[0]["labels"]["images"])

    def test_bad_request_names_the_field(self) -> None:
        with self.assertRaises(BadRequestError) as cm:
            self.client.submit("hi", image=self.image, env=["NO_EQUALS_SIGN"])
        self.assertEqual(cm.exception.status, 400)
        self.assertIn("NAME=VALUE", cm.exception.message)
        with self.assertRaises(BadRequestError):
            self.client.submit("   ")
        with self.assertRaises(ValueError):
            self.client.get("../etc")


if __name__ == "__main__":
    unittest.main()
