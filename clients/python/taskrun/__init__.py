"""Python client of the taskrun control plane's user API.

Standard library only. Submit tasks, read and list runs, follow a run's
output stream, wait for a run to end, cancel it::

    from taskrun import Client

    c = Client("http://127.0.0.1:8080", token)
    run_id = c.submit("Fix the failing test", image="taskrun/agent:local").run_id
    for chunk in c.follow(run_id):
        print(chunk.data.decode(errors="replace"), end="")
    print(c.wait(run_id, timeout=600).status)

Errors are typed by HTTP status (:mod:`taskrun.errors`).
"""

from .live import LiveClient
from .client import STATUSES, TERMINAL_STATUSES, Client, OutputChunk, Run, Submission
from .errors import (
    APIError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    TaskrunError,
    TransportError,
    UnsupportedMediaTypeError,
    WaitTimeoutError,
)

__all__ = [
    "Client",
    "LiveClient",
    "Run",
    "Submission",
    "OutputChunk",
    "STATUSES",
    "TERMINAL_STATUSES",
    "TaskrunError",
    "TransportError",
    "APIError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "PayloadTooLargeError",
    "UnsupportedMediaTypeError",
    "RateLimitError",
    "ServerError",
    "WaitTimeoutError",
]
