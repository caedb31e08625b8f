"""Client of live runs: on a host's taskrun daemon, or on a control plane.

The daemon (``taskrun daemon``) serves live runs on a unix socket; each
call is its caller's by the socket's peer credentials. The control plane
(``taskrun serve``) serves the same live API for keep-alive runs its
workers hold, to the run's tenant by its token: ``LiveClient(url=...,
token=...)``, with run IDs the control plane gives. Standard library
only::

    from taskrun.live import LiveClient

    c = LiveClient()  # $TASKRUN_HOST, else the default sockets
    c.start("r1", image="my/agent:local")
    p = c.start_process("r1", ["sh", "-c", "cat"], stdin=True)
    c.write_stdin("r1", p["id"], b"hello\\n", close=True)
    for stream, data, offset in c.output("r1", p["id"]):
        print(stream, data)
    print(c.process("r1", p["id"])["result"])
    c.stop("r1")

See docs/live-runs.md for the protocol.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import time
import urllib.parse
from typing import Any, Iterator, Mapping, Optional, Sequence

from .errors import TransportError, error_for_status

__all__ = ["LiveClient", "socket_path"]


def socket_path() -> str:
    """The daemon's socket: $TASKRUN_HOST, else root's or $XDG_RUNTIME_DIR's."""
    p = os.environ.get("TASKRUN_HOST")
    if p:
        return p
    d = os.environ.get("XDG_RUNTIME_DIR")
    if d and os.geteuid() != 0:
        cand = os.path.join(d, "taskrun.sock")
        if os.path.exists(cand):
            return cand
    return "/run/taskrun/taskrun.sock"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("taskrun", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class LiveClient:
    """Calls the live-run API of the daemon at ``path``, or, given ``url``,
    of the control plane there as the user of ``token`` ($TASKRUN_TOKEN).

    Every refusal raises the :class:`taskrun.APIError` subclass of its HTTP
    status (a run or process not found, or another user's: NotFoundError);
    a daemon or control plane that cannot be reached raises TransportError.
    """

    def __init__(
        self,
        path: Optional[str] = None,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Optional[float] = 60.0,
    ) -> None:
        self.url = url.rstrip("/") if url else None
        self.token = token if token is not None else os.environ.get("TASKRUN_TOKEN", "")
        self.path = "" if self.url else (path or socket_path())
        self.timeout = timeout

    def _connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if not self.url:
            return _UnixConnection(self.path, timeout)
        u = urllib.parse.urlsplit(self.url)
        if u.scheme == "https":
            return http.client.HTTPSConnection(u.netloc, timeout=timeout)
        return http.client.HTTPConnection(u.netloc, timeout=timeout)

    def _request(
        self,
        method: str,
        url: str,
        body: Optional[bytes] = None,
        *,
        timeout: Any = "default",
        headers: Optional[Mapping[str, str]] = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = self._connection(self.timeout if timeout == "default" else timeout)
        h = {"Content-Type": "application/json"}
        if self.url:
            h["Authorization"] = "Bearer " + self.token
            url = urllib.parse.urlsplit(self.url).path + url
        h.update(headers or {})
        try:
            conn.request(method, url, body=body, headers=h)
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            raise TransportError(f"taskrun {'control plane at ' + self.url if self.url else 'daemon at ' + self.path}: {e}") from e
        if resp.status // 100 != 2:
            data = resp.read(64 << 10)
            conn.close()
            try:
                msg = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                msg = data.decode(errors="replace").strip() or resp.reason
            raise error_for_status(resp.status, msg, method=method, url=url)
        return conn, resp

    def _json(self, method: str, url: str, body: Any = None) -> Any:
        raw = None if body is None else json.dumps(body).encode()
        conn, resp = self._request(method, url, raw)
        try:
            data = resp.read()
        finally:
            conn.close()
        return json.loads(data) if data else None

    def _frames(self, method: str, url: str, body: Optional[bytes] = None) -> Iterator[dict[str, Any]]:
        conn, resp = self._request(method, url, body, timeout=None)
        try:
            for line in resp:
                line = line.strip()
                if line:
                    yield json.loads(line)
        finally:
            conn.close()

    def start(
        self,
        run_id: Optional[str] = None,
        *,
        image: Optional[str] = None,
        command: Optional[Sequence[str]] = None,
        user: Optional[str] = None,
        env: Optional[Sequence[str]] = None,
        conversation: str = "cli",
        task: str = "default",
        session: str = "default",
        ports: Optional[Sequence[int]] = None,
        idle_timeout: Optional[float] = None,
        wait: float = 300.0,
    ) -> str:
        """Starts a live run and returns its ID once its agent runs (the
        host's image and an idle loop unless named; the caller's tenant
        unless ``user``, which only root may name on a daemon). ``ports``
        are the ports its agent serves on loopback: see :meth:`ports`.

        On a daemon the caller names the run (``run_id``); on a control
        plane the control plane does, and the run is stopped after
        ``idle_timeout`` seconds with no call (the worker's bound at most)."""
        if self.url:
            return self._start_on_control_plane(run_id, image, command, env, ports, idle_timeout, wait)
        if not run_id:
            raise ValueError("a daemon's live run needs a run_id")
        if idle_timeout is not None:
            raise ValueError("a daemon's live runs take its --max-idle")
        req: dict[str, Any] = {
            "run_id": run_id,
            "conversation": conversation,
            "task": task,
            "session": session,
            "keep_alive": True,
        }
        if image:
            req["image"] = image
        if command:
            req["command"] = list(command)
        if user:
            req["user"] = user
        if env:
            req["env"] = list(env)
        if ports:
            req["ports"] = list(ports)
        for fr in self._frames("POST", "/v1/runs", json.dumps(req).encode() + b"\n"):
            if fr.get("started"):
                return run_id
            if fr.get("result") is not None:
                raise TransportError(f"live run {run_id} ended before it ran: {fr['result'].get('error', '')}")
        raise TransportError(f"live run {run_id}: the daemon answered no start")

    def _start_on_control_plane(
        self,
        run_id: Optional[str],
        image: Optional[str],
        command: Optional[Sequence[str]],
        env: Optional[Sequence[str]],
        ports: Optional[Sequence[int]],
        idle_timeout: Optional[float],
        wait: float,
    ) -> str:
        if run_id:
            raise ValueError("the control plane names its runs: start() takes no run_id there")
        req: dict[str, Any] = {"prompt": "live run", "keep_alive": True}
        if image:
            req["image"] = image
        if command:
            req["command"] = list(command)
        if env:
            req["env"] = list(env)
        if ports:
            req["ports"] = list(ports)
        if idle_timeout is not None:
            req["idle_timeout_ms"] = max(1, int(idle_timeout * 1000))
        rid = self._json("POST", "/v1/tasks", req)["run_id"]
        deadline = time.monotonic() + wait
        while True:
            run = self._json("GET", f"/v1/runs/{_q(rid)}")
            st = run["status"]
            # Leased is RUNNING already; started_at says its agent runs.
            if st == "RUNNING" and run.get("started_at"):
                return rid
            if st not in ("QUEUED", "RUNNING"):
                raise TransportError(f"live run {rid} ended before it ran: {st}")
            if time.monotonic() > deadline:
                raise TransportError(f"live run {rid}: not running after {wait}s")
            time.sleep(0.1)

    def status(self, run_id: str) -> str:
        """The run's status on the control plane (RUNNING while live)."""
        if not self.url:
            raise ValueError("a daemon serves no run status: see its records")
        return self._json("GET", f"/v1/runs/{_q(run_id)}")["status"]

    def stop(self, run_id: str) -> None:
        """Stops live run ``run_id``: its record says CANCELLED (on a control
        plane, once its worker heard it at its next lease renewal)."""
        self._json("POST", f"/v1/runs/{_q(run_id)}/cancel")

    @staticmethod
    def _command(argv: Sequence[str], env: Optional[Sequence[str]], cwd: Optional[str], stdin: bool, tty: bool) -> dict[str, Any]:
        req: dict[str, Any] = {"argv": list(argv)}
        if env:
            req["env"] = list(env)
        if cwd:
            req["cwd"] = cwd
        if stdin:
            req["stdin"] = True
        if tty:
            req["tty"] = True
        return req

    def exec(
        self,
        run_id: str,
        argv: Sequence[str],
        *,
        env: Optional[Sequence[str]] = None,
        cwd: Optional[str] = None,
    ) -> tuple[int, bytes, bytes]:
        """Runs a command to its end: (exit status, stdout, stderr)."""
        out, err = bytearray(), bytearray()
        body = json.dumps(self._command(argv, env, cwd, False, False)).encode()
        for fr in self._frames("POST", f"/v1/runs/{_q(run_id)}/exec", body):
            if "stdout" in fr:
                out += base64.b64decode(fr["stdout"])
            elif "stderr" in fr:
                err += base64.b64decode(fr["stderr"])
            elif fr.get("exec") is not None:
                if fr["exec"].get("error"):
                    raise TransportError(f"command in run {run_id}: {fr['exec']['error']}")
                return int(fr["exec"]["exit"]), bytes(out), bytes(err)
        raise TransportError(f"command in run {run_id} has no result")

    def start_process(
        self,
        run_id: str,
        argv: Sequence[str],
        *,
        env: Optional[Sequence[str]] = None,
        cwd: Optional[str] = None,
        stdin: bool = False,
        tty: bool = False,
    ) -> dict[str, Any]:
        """Starts a command in the background: its process (``id``, ...)."""
        return self._json("POST", f"/v1/runs/{_q(run_id)}/processes", self._command(argv, env, cwd, stdin, tty))

    def processes(self, run_id: str) -> list[dict[str, Any]]:
        """The run's processes, oldest first."""
        return self._json("GET", f"/v1/runs/{_q(run_id)}/processes")

    def process(self, run_id: str, pid: str) -> dict[str, Any]:
        """One process: ``running``, ``result`` ({"exit": N}) once ended, ..."""
        return self._json("GET", f"/v1/runs/{_q(run_id)}/processes/{_q(pid)}")

    def output(
        self, run_id: str, pid: str, offset: int = 0, *, follow: bool = True
    ) -> Iterator[tuple[str, bytes, int]]:
        """Yields (``"stdout"`` or ``"stderr"``, bytes, offset) of a process's
        output from ``offset``: to its end, or what is there with follow=False."""
        q = urllib.parse.urlencode({"offset": offset, "follow": "true" if follow else "false"})
        for fr in self._frames("GET", f"/v1/runs/{_q(run_id)}/processes/{_q(pid)}/output?{q}"):
            for stream in ("stdout", "stderr"):
                if stream in fr:
                    yield stream, base64.b64decode(fr[stream]), int(fr.get("offset", 0))
            if fr.get("exec") is not None:
                return

    def write_stdin(self, run_id: str, pid: str, data: bytes, *, close: bool = False) -> None:
        """Writes ``data`` (at most 1 MiB) to a process's stdin; ``close`` closes it after."""
        url = f"/v1/runs/{_q(run_id)}/processes/{_q(pid)}/stdin?close={'true' if close else 'false'}"
        conn, resp = self._request("POST", url, data)
        resp.read()
        conn.close()

    def signal(self, run_id: str, pid: str, sig: str) -> None:
        """Sends a signal (``"TERM"``, ``"KILL"``, ...: the daemon's allow-list)."""
        self._json("POST", f"/v1/runs/{_q(run_id)}/processes/{_q(pid)}/signal", {"signal": sig})

    def ports(self, run_id: str) -> list[dict[str, Any]]:
        """The run's declared ports: ``{"port", "path", "token"}`` each; a call
        to ``path`` on the daemon's socket with the header
        ``X-Taskrun-Port-Token: token`` reaches the port (docs/live-runs.md)."""
        return self._json("GET", f"/v1/runs/{_q(run_id)}/ports")

    def usage(self, run_id: str) -> Mapping[str, Any]:
        """The run's resource usage at its last sample (cpu_seconds, peak_memory_bytes, ...)."""
        return self._json("GET", f"/v1/runs/{_q(run_id)}/usage")

    # The file API: paths under the run's home; a path or a symlink that
    # leads out of it is refused (BadRequestError); reads and writes are
    # bounded (16 MiB).

    def _file_url(self, run_id: str, path: str, op: Optional[str] = None) -> str:
        q = {"path": path}
        if op:
            q["op"] = op
        return f"/v1/runs/{_q(run_id)}/files?{urllib.parse.urlencode(q)}"

    def read_file(self, run_id: str, path: str) -> bytes:
        """The bytes of a regular file."""
        conn, resp = self._request("GET", self._file_url(run_id, path))
        try:
            return resp.read()
        finally:
            conn.close()

    def write_file(self, run_id: str, path: str, data: bytes) -> None:
        """Writes ``data`` to a file (created or truncated), owned by the run's user."""
        conn, resp = self._request("PUT", self._file_url(run_id, path), data, headers={"Content-Type": "application/octet-stream"})
        resp.read()
        conn.close()

    def list_files(self, run_id: str, path: str = ".") -> list[dict[str, Any]]:
        """A directory's entries: ``{"name", "size", "mode", "dir", "symlink", "mod_time"}`` each."""
        return self._json("GET", self._file_url(run_id, path, "list"))

    def stat(self, run_id: str, path: str) -> dict[str, Any]:
        """A path's entry (a symlink's own, not its target's)."""
        return self._json("GET", self._file_url(run_id, path, "stat"))

    def remove(self, run_id: str, path: str) -> None:
        """Removes a file or an empty directory."""
        self._json("DELETE", self._file_url(run_id, path))

    def watch(self, run_id: str, path: str = ".") -> Iterator[dict[str, Any]]:
        """Watches a path (a directory's entries, not recursive, or a file):
        ``{"event", "path", "dir"}`` events, ``event`` being ``"watching"``
        (first, once the watch holds), ``"created"``, ``"modified"``,
        ``"removed"`` or ``"overflow"`` (``"dropped"`` events were lost).
        It ends when the path is removed or the run ends; close the
        iterator to stop it sooner. A run has at most 8 watches at a time."""
        yield from self._frames("GET", self._file_url(run_id, path, "watch"))

    def port_request(
        self, run_id: str, port: int, path: str = "/", *, token: str, method: str = "GET", body: Optional[bytes] = None
    ) -> tuple[int, bytes]:
        """Calls a declared port with its ``token`` (see :meth:`ports`): its
        status and body, whatever the status."""
        conn = self._connection(self.timeout)
        h = {"X-Taskrun-Port-Token": token}
        url = f"/v1/runs/{_q(run_id)}/ports/{int(port)}/{path.lstrip('/')}"
        if self.url:
            h["Authorization"] = "Bearer " + self.token
            url = urllib.parse.urlsplit(self.url).path + url
        try:
            conn.request(method, url, body=body, headers=h)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError as e:
            raise TransportError(f"port {port} of run {run_id}: {e}") from e
        finally:
            conn.close()
