"""The taskrun control plane's user API client (standard library only).

See docs/control-plane-api.md, "User API", in the taskrun repository.
"""

from __future__ import annotations

import email.utils
import json
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from http.client import HTTPException, HTTPResponse
from typing import Any, BinaryIO, Iterator, Mapping, Optional, Sequence, Union

from .errors import (
    APIError,
    TransportError,
    WaitTimeoutError,
    error_for_status,
)

__all__ = [
    "Client",
    "Run",
    "Submission",
    "OutputChunk",
    "TERMINAL_STATUSES",
    "STATUSES",
]

#: Every status a run can have, in the order a run goes through them.
STATUSES = ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
#: The statuses a run ends in.
TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})

_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_READ_CHUNK = 64 << 10
_WORKSPACE_CHUNK = 1 << 20

Workspace = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", BinaryIO]


def _check_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _ID.match(run_id):
        raise ValueError(f"run ID {run_id!r}: IDs are 1 to 128 of A-Z a-z 0-9 _ -")
    return run_id


def _time(v: Any) -> Optional[datetime]:
    if not v:
        return None
    try:
        return datetime.fromisoformat(v)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Run:
    """One run, as ``GET /v1/runs/{id}`` answers it.

    The common fields are typed attributes; ``raw`` holds the whole JSON
    object (spec, artifact, changes, container, ...).
    """

    id: str
    status: str
    task_id: str
    user_id: str
    conversation_id: str
    prompt: str
    session_id: str
    created_at: Optional[datetime]
    started_at: Optional[datetime]
    ended_at: Optional[datetime]
    worker_id: str
    attempts: int
    exit_code: Optional[int]
    error: str
    output: str
    output_truncated: bool
    prompt_tokens: int
    completion_tokens: int
    cancel_requested: bool
    stream_next: int
    stream_ended: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def terminal(self) -> bool:
        """Whether the run has ended (SUCCEEDED, FAILED or CANCELLED)."""
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Run":
        """Build a Run from the server's JSON object."""
        task = d.get("task") or {}
        return cls(
            id=d.get("id", ""),
            status=d.get("status", ""),
            task_id=task.get("id", ""),
            user_id=task.get("user_id", ""),
            conversation_id=task.get("conversation_id", ""),
            prompt=task.get("prompt", ""),
            session_id=d.get("session_id", ""),
            created_at=_time(d.get("created_at")),
            started_at=_time(d.get("started_at")),
            ended_at=_time(d.get("ended_at")),
            worker_id=d.get("worker_id", ""),
            attempts=int(d.get("attempts", 0)),
            exit_code=d.get("exit_code"),
            error=d.get("error", ""),
            output=d.get("output", ""),
            output_truncated=bool(d.get("output_truncated", False)),
            prompt_tokens=int(d.get("prompt_tokens", 0)),
            completion_tokens=int(d.get("completion_tokens", 0)),
            cancel_requested=bool(d.get("cancel_requested", False)),
            stream_next=int(d.get("stream_next", 0)),
            stream_ended=bool(d.get("stream_ended", False)),
            raw=d,
        )


@dataclass(frozen=True)
class Submission:
    """The answer to a submission (``POST /v1/tasks``, 201)."""

    task_id: str
    run_id: str
    status: str
    workspace: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class OutputChunk:
    """A piece of a run's output stream: ``data`` starts at byte ``offset``."""

    offset: int
    data: bytes

    @property
    def end(self) -> int:
        """The offset just past this piece: where to resume."""
        return self.offset + len(self.data)


class Client:
    """A client of one taskrun control plane, acting with one user token.

    Example::

        c = Client("http://127.0.0.1:8080", os.environ["TASKRUN_TOKEN"])
        sub = c.submit("Fix the failing test", image="taskrun/agent:local", model="scripted")
        for chunk in c.follow(sub.run_id):
            sys.stdout.buffer.write(chunk.data)
        run = c.wait(sub.run_id, timeout=600)

    Args:
        base_url: the control plane, ``http://HOST:PORT`` or ``https://HOST``.
        token: a user token (``Authorization: Bearer``).
        timeout: seconds each request may wait for the server's next bytes.
            A follow whose server stays silent that long reconnects at the
            offset reached, so it never ends by itself on a quiet run.
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"server URL {base_url!r}: give http://HOST:PORT or https://HOST")
        if not token:
            raise ValueError("no token: pass a user token (e.g. $TASKRUN_TOKEN)")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout = timeout
        # No proxy from the environment and no redirect followed: the token
        # goes only where base_url says.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    # -- HTTP ---------------------------------------------------------------

    def _url(self, path: str, query: Optional[Mapping[str, Any]] = None) -> str:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return url

    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Mapping[str, Any]] = None,
        body: Any = None,
        content_type: Optional[str] = None,
        expect: int = 200,
    ) -> HTTPResponse:
        """Send a request; return the open response when its status is
        ``expect``, else raise the matching APIError (closing it)."""
        url = self._url(path, query)
        req = urllib.request.Request(url, data=body, method=method)
        req.add_header("Authorization", "Bearer " + self._token)
        req.add_header("User-Agent", "taskrun-python-client")
        if content_type:
            req.add_header("Content-Type", content_type)
        try:
            resp = self._opener.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            with e:
                raise _api_error(e.code, e.headers, e.read(8 << 10), method, url) from None
        except (urllib.error.URLError, OSError, HTTPException) as e:
            raise TransportError(f"{method} {url}: {e}") from e
        if resp.status != expect:
            with resp:
                raise _api_error(resp.status, resp.headers, resp.read(8 << 10), method, url)
        return resp

    def _json(self, method: str, path: str, *, expect: int = 200, **kw: Any) -> Any:
        with self._open(method, path, expect=expect, **kw) as resp:
            try:
                return json.load(resp)
            except (ValueError, OSError, HTTPException) as e:
                raise TransportError(f"{method} {path}: reading the answer: {e}") from e

    # -- user API -----------------------------------------------------------

    def submit(
        self,
        prompt: str,
        *,
        image: Optional[str] = None,
        model: Optional[str] = None,
        runtime: Optional[str] = None,
        command: Optional[Sequence[str]] = None,
        env: Optional[Union[Sequence[str], Mapping[str, str]]] = None,
        limits: Optional[Mapping[str, Any]] = None,
        egress: Optional[Mapping[str, Any]] = None,
        conversation_id: Optional[str] = None,
        session_id: Optional[str] = None,
        previous_run_id: Optional[str] = None,
        retryable: bool = False,
        workspace: Optional[Workspace] = None,
    ) -> Submission:
        """Submit a task: creates it and its first run, QUEUED.

        Args:
            prompt: the instruction given to the agent (required).
            image, model, runtime, command: what the worker runs.
            env: ``NAME=VALUE`` strings, or a mapping of names to values.
            limits: e.g. ``{"timeout_ms": 600000, "memory_bytes": 1 << 30}``.
            egress: the egress the run asks for, e.g.
                ``{"rules": [{"host": "api.github.com"}]}``.
            conversation_id, session_id, previous_run_id: see the API docs.
            retryable: the task may be executed again if its worker is lost.
            workspace: a gzip'd tar of the starting workspace: its bytes, a
                path to it, or a binary file open for reading. It is streamed.

        Raises:
            BadRequestError: a field is invalid (the message names it).
            RateLimitError: too many of your runs are queued.
        """
        task: dict[str, Any] = {"prompt": prompt}
        if isinstance(env, Mapping):
            env = [f"{k}={v}" for k, v in env.items()]
        for key, val in (
            ("conversation_id", conversation_id),
            ("session_id", session_id),
            ("previous_run_id", previous_run_id),
            ("model", model),
            ("image", image),
            ("runtime", runtime),
            ("command", list(command) if command is not None else None),
            ("env", list(env) if env is not None else None),
            ("limits", dict(limits) if limits is not None else None),
            ("egress", dict(egress) if egress is not None else None),
        ):
            if val is not None:
                task[key] = val
        if retryable:
            task["retryable"] = True
        if previous_run_id is not None:
            _check_id(previous_run_id)
        body = json.dumps(task).encode()
        if workspace is None:
            d = self._json("POST", "/v1/tasks", body=body, content_type="application/json", expect=201)
        else:
            boundary = "taskrun-" + uuid.uuid4().hex
            d = self._json(
                "POST",
                "/v1/tasks",
                body=_multipart(boundary, body, workspace),
                content_type="multipart/form-data; boundary=" + boundary,
                expect=201,
            )
        return Submission(d["task_id"], d["run_id"], d["status"], d.get("workspace"))

    def get(self, run_id: str) -> Run:
        """Return one of your runs.

        Raises:
            NotFoundError: no such run, or another user's.
        """
        return Run.from_json(self._json("GET", "/v1/runs/" + _check_id(run_id)))

    def list_runs(self, status: Optional[str] = None, limit: Optional[int] = None) -> list[Run]:
        """Return your runs, newest first, without their output and prompt.

        Args:
            status: keep only runs with this status (one of STATUSES).
            limit: at most this many (1 to 500; the server's default is 50).
        """
        q = {"status": status.upper() if status else None, "limit": limit}
        d = self._json("GET", "/v1/runs", query=q)
        return [Run.from_json(r) for r in d.get("runs", [])]

    def cancel(self, run_id: str) -> Run:
        """Cancel a run and return it. A QUEUED run ends CANCELLED at once; a
        RUNNING one is flagged (``cancel_requested``) and its worker stops it.

        Raises:
            ConflictError: the run had already ended.
            NotFoundError: no such run, or another user's.
        """
        return Run.from_json(self._json("POST", "/v1/runs/" + _check_id(run_id) + "/cancel"))

    def record(self, run_id: str) -> dict[str, Any]:
        """Return the run's record as its worker stored it (the JSON ``taskrun
        inspect --json`` prints: status, reason, image digest, limits, the
        isolation verdict, the change summary, every stored object).

        Raises:
            NotFoundError: no such run, another user's, or none stored yet.
        """
        return dict(self._json("GET", "/v1/runs/" + _check_id(run_id) + "/record"))

    def patch(self, run_id: str) -> bytes:
        """Return what the run changed in its workspace, as a git patch
        (``changes.patch``; ``git apply`` applies it)."""
        return self._read("/v1/runs/" + _check_id(run_id) + "/patch")

    def changes(self, run_id: str) -> dict[str, Any]:
        """Return the run's change list (``changes.json``): every changed path
        with its kind, modes, sizes and SHA-256, and the patterns excluded."""
        return dict(self._json("GET", "/v1/runs/" + _check_id(run_id) + "/changes"))

    def file(self, run_id: str, path: str) -> bytes:
        """Return one file the run stored, named as ``taskrun cp`` names it:
        ``artifacts/PATH``, ``output/result.md``, ``home/PATH`` (its final
        home) or another object its record lists.

        Raises:
            ValueError: ``path`` is not a clean relative path.
        """
        parts = path.split("/")
        if any(p in ("", ".", "..") or "\\" in p for p in parts):
            raise ValueError(f"path {path!r}: give a clean relative path such as artifacts/report.md")
        quoted = "/".join(urllib.parse.quote(p, safe="") for p in parts)
        return self._read("/v1/runs/" + _check_id(run_id) + "/files/" + quoted)

    def _read(self, path: str) -> bytes:
        with self._open("GET", path) as resp:
            try:
                return resp.read()
            except (OSError, HTTPException) as e:
                raise TransportError(f"GET {path}: reading the answer: {e}") from e

    def workers(self) -> list[dict[str, Any]]:
        """Return the workers heard from in the last 24 hours, most recently
        seen first: their ``id``, ``capacity``, ``labels`` and ``last_seen``."""
        return list(self._json("GET", "/v1/workers").get("workers", []))

    def read_output(self, run_id: str, offset: int = 0) -> bytes:
        """Return the run's output held now, from byte ``offset``."""
        return b"".join(c.data for c in self._output(run_id, offset, follow=False))

    def follow(
        self,
        run_id: str,
        offset: int = 0,
        *,
        max_reconnects: int = 5,
    ) -> Iterator[OutputChunk]:
        """Yield the run's output from byte ``offset`` as it arrives, until
        the worker ends the stream (or the run is over without ending it).

        A dropped or silent connection is resumed at the offset reached, so
        no byte is lost or repeated; after ``max_reconnects`` failures in a
        row without a byte received, the last error is raised.

        Raises:
            NotFoundError: no such run, or another user's.
            RateLimitError: too many readers of this run.
            TransportError: the stream could not be resumed.
        """
        _check_id(run_id)
        if offset < 0:
            raise ValueError("offset: a byte offset, 0 or more")
        failures = 0
        while True:
            try:
                for chunk in self._output(run_id, offset, follow=True):
                    offset = chunk.end
                    failures = 0
                    yield chunk
                return
            except _Silent:
                continue  # a quiet run: ask again from where we are
            except TransportError:
                failures += 1
                if failures > max_reconnects:
                    raise
                time.sleep(min(0.2 * 2 ** (failures - 1), 5.0))

    def _output(self, run_id: str, offset: int, *, follow: bool) -> Iterator[OutputChunk]:
        path = "/v1/runs/" + _check_id(run_id) + "/output"
        q = {"offset": offset, "follow": "1" if follow else None}
        resp = self._open("GET", path, query=q)
        with resp:
            while True:
                try:
                    data = resp.read1(_READ_CHUNK)
                except socket.timeout as e:
                    raise _Silent(f"GET {path}: nothing for {self.timeout:g} s at offset {offset}") from e
                except (OSError, HTTPException) as e:
                    raise TransportError(f"GET {path}: stream broke at offset {offset}: {e}") from e
                if not data:
                    return
                yield OutputChunk(offset, data)
                offset += len(data)

    def wait(self, run_id: str, timeout: Optional[float] = None, *, poll_interval: float = 1.0) -> Run:
        """Poll the run until it ends, and return it.

        Args:
            timeout: give up after this many seconds (None: never).
            poll_interval: seconds between reads.

        Raises:
            WaitTimeoutError: the run did not end in time (``.run`` is the
                run as last seen).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        run: Optional[Run] = None
        while True:
            run = self.get(run_id)
            if run.terminal:
                return run
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeoutError(run_id, timeout or 0, run)
                time.sleep(min(poll_interval, left))
            else:
                time.sleep(poll_interval)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuses redirects: the control plane sends none, and following one
    would carry the token elsewhere. The 3xx becomes an APIError."""

    def redirect_request(self, *args: Any, **kw: Any) -> None:
        return None


class _Silent(TransportError):
    """A follow's server sent nothing for the client's timeout."""


def _retry_after(value: Optional[str]) -> Optional[float]:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _api_error(status: int, headers: Any, body: bytes, method: str, url: str) -> APIError:
    message = ""
    ctype = (headers.get("Content-Type") or "") if headers is not None else ""
    if "json" in ctype:
        try:
            message = str(json.loads(body).get("error") or "")
        except (ValueError, AttributeError):
            message = ""
    if not message and ctype.startswith("text/plain"):
        message = body.decode("utf-8", "replace").strip()
    if not message:
        from http import HTTPStatus

        try:
            message = HTTPStatus(status).phrase
        except ValueError:
            message = "HTTP " + str(status)
    ra = _retry_after(headers.get("Retry-After") if headers is not None else None)
    return error_for_status(status, message, retry_after=ra, method=method, url=url)


def _multipart(boundary: str, task: bytes, workspace: Workspace) -> Iterator[bytes]:
    """Stream a multipart/form-data body: the task's JSON, then the
    workspace archive read in pieces (sent chunked)."""
    b = boundary.encode()
    yield (
        b"--" + b + b"\r\n"
        b'Content-Disposition: form-data; name="task"\r\n'
        b"Content-Type: application/json\r\n\r\n" + task + b"\r\n"
        b"--" + b + b"\r\n"
        b'Content-Disposition: form-data; name="workspace"; filename="workspace.tar.gz"\r\n'
        b"Content-Type: application/gzip\r\n\r\n"
    )
    if isinstance(workspace, (bytes, bytearray, memoryview)):
        yield bytes(workspace)
    elif isinstance(workspace, (str, os.PathLike)):
        with open(workspace, "rb") as f:
            while piece := f.read(_WORKSPACE_CHUNK):
                yield piece
    else:
        while piece := workspace.read(_WORKSPACE_CHUNK):
            yield piece
    yield b"\r\n--" + b + b"--\r\n"
