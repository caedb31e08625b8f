"""The live-run client against a real taskrun daemon.

clients/clients_test.go starts ``taskrun daemon`` and names its socket in
TASKRUN_HOST (with TASKRUN_TEST_IMAGE and TASKRUN_CLIENT_RUN_LOG, as for
test_live). Without TASKRUN_HOST they are skipped.
"""

from __future__ import annotations

import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from taskrun import BadRequestError, NotFoundError  # noqa: E402
from taskrun.live import LiveClient  # noqa: E402

HOST = os.environ.get("TASKRUN_HOST", "")
IMAGE = os.environ.get("TASKRUN_TEST_IMAGE", "taskrun/testbox:local")


@unittest.skipUnless(HOST, "TASKRUN_HOST names no daemon")
class ProcessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.c = LiveClient(HOST)
        cls.run_id = "py" + uuid.uuid4().hex[:10]
        log = os.environ.get("TASKRUN_CLIENT_RUN_LOG")
        if log:
            with open(log, "a") as f:
                f.write(cls.run_id + "\n")
        cls.c.start(cls.run_id, image=IMAGE, user="alice", ports=[8080])

    @classmethod
    def tearDownClass(cls) -> None:
        cls.c.stop(cls.run_id)

    def test_exec(self) -> None:
        for i in range(5):
            code, out, err = self.c.exec(self.run_id, ["sh", "-c", 'echo "$N"; echo e >&2; exit $N'], env=[f"N={i}"])
            self.assertEqual(code, i)
            self.assertEqual(out, f"{i}\n".encode())
            self.assertEqual(err, b"e\n")

    def test_stdin(self) -> None:
        p = self.c.start_process(self.run_id, ["sh", "-c", 'while read l; do echo "got $l"; done'], stdin=True)
        self.c.write_stdin(self.run_id, p["id"], b"a\n")
        self.c.write_stdin(self.run_id, p["id"], b"b\n", close=True)
        out = b"".join(d for s, d, _ in self.c.output(self.run_id, p["id"]) if s == "stdout")
        self.assertEqual(out, b"got a\ngot b\n")
        self.assertEqual(self.c.process(self.run_id, p["id"])["result"]["exit"], 0)

    def test_signal_and_reattach(self) -> None:
        p = self.c.start_process(self.run_id, ["sh", "-c", "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done"])
        seen, offset = b"", 0
        deadline = time.monotonic() + 60
        while b"ready" not in seen and time.monotonic() < deadline:
            for _, data, off in self.c.output(self.run_id, p["id"], offset, follow=False):
                seen += data
                offset = off + len(data)
            time.sleep(0.05)
        self.assertEqual(seen, b"ready\n")
        with self.assertRaises(BadRequestError):
            self.c.signal(self.run_id, p["id"], "SEGV")
        self.c.signal(self.run_id, p["id"], "TERM")
        rest = b"".join(d for _, d, _ in self.c.output(self.run_id, p["id"], offset))
        self.assertEqual(rest, b"term\n")
        self.assertEqual(self.c.process(self.run_id, p["id"])["result"]["exit"], 7)
        ids = [q["id"] for q in self.c.processes(self.run_id)]
        self.assertIn(p["id"], ids)

    def test_not_found(self) -> None:
        with self.assertRaises(NotFoundError) as cm:
            self.c.process(self.run_id, "p999")
        self.assertIn("p999", cm.exception.message)
        with self.assertRaises(NotFoundError):
            self.c.signal("no-such-run", "p1", "TERM")

    def test_ports(self) -> None:
        (p,) = self.c.ports(self.run_id)
        self.assertEqual(p["port"], 8080)
        self.assertEqual(p["path"], f"/v1/runs/{self.run_id}/ports/8080/")
        self.assertEqual(len(p["token"]), 43)

    def test_usage(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            try:
                u = self.c.usage(self.run_id)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.assertGreater(u["samples"], 0)
        self.assertGreater(u["peak_memory_bytes"], 0)


if __name__ == "__main__":
    unittest.main()
