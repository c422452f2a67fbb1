"""dtrain's exceptions: one hierarchy, each carrying the gRPC status code and the server's message.

Every call of the package raises a subclass of :class:`DtrainError`, never a raw
``grpc.RpcError``. Catch :class:`DtrainError` for everything, or a subclass for one case::

    try:
        job = client.submit("job.yaml")
    except dtrain.InvalidArgument as e:     # the spec, with the key's path in e.message
        ...
"""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

__all__ = [
    "DtrainError",
    "InvalidArgument",
    "NotFound",
    "FailedPrecondition",
    "DeadlineExceeded",
    "Aborted",
    "Unavailable",
    "Unauthenticated",
    "JobFailed",
    "from_rpc_error",
    "DataLoss",
    "PermissionDenied",
]


class DtrainError(Exception):
    """A failed dtrain call: ``code`` is the grpc.StatusCode, ``message`` the server's words."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidArgument(DtrainError):
    """The request itself is wrong (a spec key or value, a tensor's shape); fix the input."""


class NotFound(DtrainError):
    """No such job, file or group."""


class FailedPrecondition(DtrainError):
    """The call is valid but not now: ranks disagree about a collective, a group is full, a
    job is already over, the call does not fit a default gRPC message."""


class DeadlineExceeded(DtrainError):
    """Some ranks did not arrive in time (the message names them), or a wait timed out."""


class Aborted(DtrainError):
    """A member of the group died (named with its host); the group is unusable."""


class Unavailable(DtrainError):
    """The coordinator cannot be reached or is shutting down."""


class DataLoss(DtrainError):
    """A file's bytes did not hash to its digest (corrupted or cut short); nothing was kept."""


class PermissionDenied(DtrainError):
    """The token is valid but not for this: a job token outside its own job."""


class Unauthenticated(DtrainError):
    """The coordinator requires a token (DTRAIN_TOKEN, or token=) that this call lacks or got
    wrong."""


class JobFailed(DtrainError):
    """A job ended FAILED or CANCELLED; ``status`` is its final JobStatus and ``message`` the
    reason (naming the rank and worker where it failed)."""

    def __init__(self, status):
        from dtrain.v1 import jobs_pb2

        state = jobs_pb2.JobState.Name(status.state)
        super().__init__(
            grpc.StatusCode.CANCELLED if state == "CANCELLED" else grpc.StatusCode.ABORTED,
            f"job {status.id} {state}" + (f": {status.reason}" if status.reason else ""),
        )
        self.status = status


_BY_CODE: Dict[grpc.StatusCode, Type[DtrainError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


def error_for(code: grpc.StatusCode, message: str) -> DtrainError:
    """The exception for a status code; codes without a class of their own are DtrainError."""
    return _BY_CODE.get(code, DtrainError)(code, message)


def from_rpc_error(error: grpc.RpcError, address: Optional[str] = None) -> DtrainError:
    """Turns a grpc.RpcError into the matching DtrainError."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = error.details() if hasattr(error, "details") else str(error)
    message = message or ""
    if code == grpc.StatusCode.UNAVAILABLE and address:
        message = (
            f"cannot reach {address} ({message}); start a cluster with deploy/local/cluster.sh "
            "start, or set DTRAIN_COORDINATOR / address="
        )
    return error_for(code, message)
