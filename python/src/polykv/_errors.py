"""polykv.Error and one subclass per status code of the C API (values of polykv_status)."""

from __future__ import annotations

CODE_NAMES = {
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
}


class Error(Exception):
    """A failed PolyKV call: `code` is the C API's polykv_status (absl::StatusCode values),
    `code_name` its name ("NOT_FOUND"), `message` the library's detailed message."""

    code = 2

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    @property
    def code_name(self) -> str:
        return CODE_NAMES.get(self.code, "UNKNOWN")

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}"


class CancelledError(Error):
    code = 1


class UnknownError(Error):
    code = 2


class InvalidArgumentError(Error, ValueError):
    code = 3


class DeadlineExceededError(Error, TimeoutError):
    code = 4


class NotFoundError(Error):
    code = 5


class AlreadyExistsError(Error):
    code = 6


class PermissionDeniedError(Error, PermissionError):
    code = 7


class ResourceExhaustedError(Error):
    code = 8


class FailedPreconditionError(Error):
    code = 9


class AbortedError(Error):
    code = 10


class OutOfRangeError(Error):
    code = 11


class UnimplementedError(Error):
    code = 12


class InternalError(Error):
    code = 13


class UnavailableError(Error, ConnectionError):
    code = 14


class DataLossError(Error):
    code = 15


_BY_CODE = {
    cls.code: cls
    for cls in (
        CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError,
        NotFoundError, AlreadyExistsError, PermissionDeniedError, ResourceExhaustedError,
        FailedPreconditionError, AbortedError, OutOfRangeError, UnimplementedError,
        InternalError, UnavailableError, DataLossError,
    )
}


def error_for(code: int, message: str) -> Error:
    """The exception for a C status code (called by the extension)."""
    cls = _BY_CODE.get(code, Error)
    return cls(message, code)
