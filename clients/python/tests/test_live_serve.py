"""The live-run client against a real control plane and worker.

clients/clients_test.go starts ``taskrun serve`` and ``taskrun worker
--live-listen`` and names them as for test_live (TASKRUN_URL, TASKRUN_TOKEN,
TASKRUN_OTHER_TOKEN, TASKRUN_TEST_IMAGE, TASKRUN_CLIENT_RUN_LOG), with
TASKRUN_WORKER_METRICS, the worker's /metrics address. Without TASKRUN_URL
they are skipped.
"""

from __future__ import annotations

import os
import sys
import time
import unittest
import urllib.request
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import taskrun  # noqa: E402
from taskrun import BadRequestError, NotFoundError  # noqa: E402
from taskrun.live import LiveClient  # noqa: E402

URL = os.environ.get("TASKRUN_URL", "")
TOKEN = os.environ.get("TASKRUN_TOKEN", "")
OTHER = os.environ.get("TASKRUN_OTHER_TOKEN", "")
IMAGE = os.environ.get("TASKRUN_TEST_IMAGE", "taskrun/testbox:local")
METRICS = os.environ.get("TASKRUN_WORKER_METRICS", "")

# The live run's command: HTTP on 127.0.0.1:8080 inside its container.
PORT_AGENT = "mkdir -p /tmp/www && echo hello-port > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www"


def _log_run(run_id: str) -> None:
    log = os.environ.get("TASKRUN_CLIENT_RUN_LOG")
    if log:
        with open(log, "a") as f:
            f.write(run_id + "\n")


def _wait_status(c: LiveClient, run_id: str, within: float) -> str:
    deadline = time.monotonic() + within
    while True:
        st = c.status(run_id)
        if st != "RUNNING" or time.monotonic() > deadline:
            return st
        time.sleep(0.2)


@unittest.skipUnless(URL, "TASKRUN_URL names no control plane")
class LiveServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.c = LiveClient(url=URL, token=TOKEN)
        cls.run_id = cls.c.start(image=IMAGE, command=["sh", "-c", PORT_AGENT], ports=[8080])
        _log_run(cls.run_id)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.c.stop(cls.run_id)
        st = _wait_status(cls.c, cls.run_id, 120)
        assert st == "CANCELLED", st

    def test_commands_and_files(self) -> None:
        r = self.run_id
        for i in range(50):
            code, out, err = self.c.exec(r, ["sh", "-c", 'echo "$N"; echo e >&2; exit $((N % 3))'], env=[f"N={i}"])
            self.assertEqual((code, out, err), (i % 3, f"{i}\n".encode(), b"e\n"))
        ops = 0
        for i in range(40):
            name = f"f{i}.txt"
            data = f"content {i}\n".encode() * (i + 1)
            self.c.write_file(r, name, data)
            self.assertEqual(self.c.read_file(r, name), data)
            self.assertEqual(self.c.stat(r, name)["size"], len(data))
            self.assertIn(name, [e["name"] for e in self.c.list_files(r, ".")])
            self.c.remove(r, name)
            ops += 5
        self.assertEqual(ops, 200)
        with self.assertRaises(NotFoundError):
            self.c.stat(r, "f0.txt")
        # A file written through the API is the run's user's: its commands see it.
        self.c.write_file(r, "seen.txt", b"by the api\n")
        code, out, _ = self.c.exec(r, ["cat", "seen.txt"])
        self.assertEqual((code, out), (0, b"by the api\n"))

    def test_watch(self) -> None:
        r = self.run_id
        code, _, err = self.c.exec(r, ["mkdir", "-p", "watched"])
        self.assertEqual(code, 0, err)
        events = self.c.watch(r, "watched")
        try:
            self.assertEqual(next(events)["event"], "watching")
            self.c.write_file(r, "watched/w.txt", b"x")
            self.c.remove(r, "watched/w.txt")
            seen = []
            for e in events:
                seen.append((e["event"], e.get("path")))
                if seen[-1] == ("removed", "watched/w.txt"):
                    break
            self.assertIn(("created", "watched/w.txt"), seen)
            self.assertIn(("modified", "watched/w.txt"), seen)
        finally:
            events.close()

    def test_commands_are_recorded(self) -> None:
        r = self.run_id
        marker = "recorded-" + uuid.uuid4().hex[:8]
        self.assertEqual(self.c.exec(r, ["echo", marker])[0], 0)
        deadline = time.monotonic() + 60
        while True:
            try:
                execs = taskrun.Client(URL, TOKEN).record(r).get("execs") or []
            except taskrun.APIError:
                execs = []  # its index record is written once it runs
            mine = [e for e in execs if e["command"] == ["echo", marker]]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual(len(mine), 1, execs)
        self.assertEqual(mine[0]["exit"], 0)
        self.assertEqual(mine[0]["by"], "user alice through taskrun serve")

    def test_processes_stdin_and_signal(self) -> None:
        r = self.run_id
        p = self.c.start_process(r, ["sh", "-c", 'while read l; do echo "got $l"; done'], stdin=True)
        self.c.write_stdin(r, p["id"], b"a\n", close=True)
        out = b"".join(d for s, d, _ in self.c.output(r, p["id"]) if s == "stdout")
        self.assertEqual(out, b"got a\n")
        q = self.c.start_process(r, ["sh", "-c", "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done"])
        seen, offset = b"", 0
        deadline = time.monotonic() + 60
        while b"ready" not in seen and time.monotonic() < deadline:
            for _, data, off in self.c.output(r, q["id"], offset, follow=False):
                seen += data
                offset = off + len(data)
            time.sleep(0.05)
        self.c.signal(r, q["id"], "TERM")
        rest = b"".join(d for _, d, _ in self.c.output(r, q["id"], offset))
        self.assertEqual(rest, b"term\n")
        self.assertEqual(self.c.process(r, q["id"])["result"]["exit"], 7)
        self.assertIn(q["id"], [x["id"] for x in self.c.processes(r)])

    def test_escapes_are_refused(self) -> None:
        r = self.run_id
        outside = f"/tmp/taskrun-escape-{uuid.uuid4().hex}"
        for path in ("../../../../etc/passwd", "/../../etc/passwd", "a/../../x"):
            with self.assertRaises((BadRequestError, NotFoundError), msg=path):
                self.c.read_file(r, path)
        code, _, err = self.c.exec(r, ["sh", "-c", f"ln -s /etc/passwd link && ln -s {outside} wlink && ln -s / root"])
        self.assertEqual(code, 0, err)
        with self.assertRaises(BadRequestError):
            self.c.read_file(r, "link")
        with self.assertRaises(BadRequestError):
            self.c.read_file(r, "root/etc/passwd")
        with self.assertRaises(BadRequestError):
            self.c.write_file(r, "wlink", b"escaped")
        with self.assertRaises(BadRequestError):
            self.c.list_files(r, "root")
        self.assertFalse(os.path.exists(outside), "a write through a symlink reached the host")
        self.assertTrue(self.c.stat(r, "link")["symlink"])

    def test_port_answers_only_with_its_token(self) -> None:
        r = self.run_id
        (p,) = self.c.ports(r)
        self.assertEqual(p["port"], 8080)
        self.assertEqual(p["path"], f"/v1/runs/{r}/ports/8080/")
        deadline = time.monotonic() + 60
        while True:
            status, body = self.c.port_request(r, 8080, "/", token=p["token"])
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.assertEqual((status, body), (200, b"hello-port\n"))
        self.assertEqual(self.c.port_request(r, 8080, "/", token="")[0], 401)
        self.assertEqual(self.c.port_request(r, 8080, "/", token="x" + p["token"][1:])[0], 401)
        self.assertEqual(self.c.port_request(r, 8081, "/", token=p["token"])[0], 404)
        other = LiveClient(url=URL, token=OTHER)
        self.assertEqual(other.port_request(r, 8080, "/", token=p["token"])[0], 404)

    def test_another_tenant_gets_not_found(self) -> None:
        r = self.run_id
        bob = LiveClient(url=URL, token=OTHER)
        calls = [
            lambda: bob.exec(r, ["true"]),
            lambda: bob.start_process(r, ["true"]),
            lambda: bob.processes(r),
            lambda: bob.process(r, "p1"),
            lambda: list(bob.output(r, "p1")),
            lambda: bob.write_stdin(r, "p1", b"x"),
            lambda: bob.signal(r, "p1", "TERM"),
            lambda: bob.ports(r),
            lambda: bob.usage(r),
            lambda: bob.read_file(r, "seen.txt"),
            lambda: bob.write_file(r, "bob.txt", b"x"),
            lambda: bob.list_files(r),
            lambda: bob.stat(r, "."),
            lambda: bob.remove(r, "seen.txt"),
            lambda: bob.status(r),
            lambda: bob.stop(r),
        ]
        for i, call in enumerate(calls):
            with self.assertRaises(NotFoundError, msg=f"call {i}"):
                call()
        self.assertEqual(self.c.status(r), "RUNNING")

    def test_usage_and_metrics(self) -> None:
        r = self.run_id
        deadline = time.monotonic() + 30
        while True:
            try:
                u = self.c.usage(r)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.assertGreater(u["samples"], 0)
        self.assertGreater(u["peak_memory_bytes"], 0)
        if METRICS:
            text = urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10).read().decode()
            self.assertIn(f'taskrun_worker_live_run_peak_memory_bytes{{run="{r}"}}', text)
            self.assertIn(f'taskrun_worker_live_run_cpu_seconds{{run="{r}"}}', text)


@unittest.skipUnless(URL, "TASKRUN_URL names no control plane")
class IdleTest(unittest.TestCase):
    def test_idle_run_is_stopped(self) -> None:
        c = LiveClient(url=URL, token=TOKEN)
        r = c.start(image=IMAGE, idle_timeout=3)
        _log_run(r)
        code, out, _ = c.exec(r, ["echo", "alive"])
        self.assertEqual((code, out), (0, b"alive\n"))
        self.assertEqual(_wait_status(c, r, 120), "CANCELLED")


if __name__ == "__main__":
    unittest.main()
