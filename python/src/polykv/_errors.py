"""polykv.Error and one subclass per status code of the C API (values of polykv_status)."""

from __future__ import annotations

# The one table of status codes: (polykv_status value, its name, the Error subclass raised for
# it, the builtin exception that subclass also derives from).
_CODES = (
    (1, "CANCELLED", "CancelledError", None),
    (2, "UNKNOWN", "UnknownError", None),
    (3, "INVALID_ARGUMENT", "InvalidArgumentError", ValueError),
    (4, "DEADLINE_EXCEEDED", "DeadlineExceededError", TimeoutError),
    (5, "NOT_FOUND", "NotFoundError", None),
    (6, "ALREADY_EXISTS", "AlreadyExistsError", None),
    (7, "PERMISSION_DENIED", "PermissionDeniedError", PermissionError),
    (8, "RESOURCE_EXHAUSTED", "ResourceExhaustedError", None),
    (9, "FAILED_PRECONDITION", "FailedPreconditionError", None),
    (10, "ABORTED", "AbortedError", None),
    (11, "OUT_OF_RANGE", "OutOfRangeError", None),
    (12, "UNIMPLEMENTED", "UnimplementedError", None),
    (13, "INTERNAL", "InternalError", None),
    (14, "UNAVAILABLE", "UnavailableError", ConnectionError),
    (15, "DATA_LOSS", "DataLossError", None),
)

CODE_NAMES = {code: name for code, name, _, _ in _CODES}


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


_BY_CODE: dict[int, type[Error]] = {}
for _code, _status, _name, _builtin in _CODES:
    _cls = type(_name, (Error,) if _builtin is None else (Error, _builtin),
                {"code": _code, "__module__": __name__,
                 "__doc__": f"polykv.Error with code {_code} ({_status})."})
    globals()[_name] = _BY_CODE[_code] = _cls
del _code, _status, _name, _builtin, _cls


def error_for(code: int, message: str) -> Error:
    """The exception for a C status code (called by the extension)."""
    cls = _BY_CODE.get(code, Error)
    return cls(message, code)
