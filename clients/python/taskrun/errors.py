"""Errors raised by :class:`taskrun.Client`.

Every answer of the control plane other than the one expected becomes an
:class:`APIError` subclass chosen by its HTTP status, carrying the server's
own message (the ``error`` field of its JSON answer). Failures to reach the
server at all are :class:`TransportError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    from .client import Run

__all__ = [
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
    "error_for_status",
]


class TaskrunError(Exception):
    """Base class of every error this package raises."""


class TransportError(TaskrunError):
    """The control plane could not be reached, or the connection broke."""


class APIError(TaskrunError):
    """The control plane answered with an unexpected HTTP status.

    Attributes:
        status: the HTTP status code.
        message: the server's message (its JSON ``error`` field, else the
            body's text, else the status's reason).
        retry_after: seconds from the ``Retry-After`` header, when given.
        method, url: the request that was answered.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        retry_after: Optional[float] = None,
        method: str = "",
        url: str = "",
    ) -> None:
        super().__init__(f"control plane answered {status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.method = method
        self.url = url


class BadRequestError(APIError):
    """400: a field of the request is invalid; the message names it."""


class AuthenticationError(APIError):
    """401: the token is missing or unknown. Check the token you passed."""


class PermissionDeniedError(APIError):
    """403: the token is known but may not use this endpoint (a worker
    token on the user API)."""


class NotFoundError(APIError):
    """404: no such run, or the run belongs to another user (the server
    does not tell the two apart)."""


class ConflictError(APIError):
    """409: the request conflicts with the run's state (e.g. cancelling a
    run that has already ended)."""


class PayloadTooLargeError(APIError):
    """413: the task's JSON or the workspace archive is over a cap."""


class UnsupportedMediaTypeError(APIError):
    """415: the body was sent with a content type the server refuses."""


class RateLimitError(APIError):
    """429: too many queued runs, or too many readers of one run's output.
    ``retry_after`` says how long to wait."""


class ServerError(APIError):
    """5xx: the control plane failed; the request may be retried."""


class WaitTimeoutError(TaskrunError, TimeoutError):
    """:meth:`taskrun.Client.wait` gave up before the run ended.

    Attributes:
        run: the run as last seen (not terminal), or None if never read.
    """

    def __init__(self, run_id: str, timeout: float, run: "Optional[Run]") -> None:
        status = run.status if run is not None else "unknown"
        super().__init__(f"run {run_id} did not end within {timeout:g} s (last status {status})")
        self.run_id = run_id
        self.run = run


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    429: RateLimitError,
}


def error_for_status(
    status: int,
    message: str,
    *,
    retry_after: Optional[float] = None,
    method: str = "",
    url: str = "",
) -> APIError:
    """Return the :class:`APIError` subclass instance for an HTTP status."""
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else APIError
    return cls(status, message, retry_after=retry_after, method=method, url=url)
