"""A channel to the coordinator with the CLI's defaults: address, token and TLS from arguments
or the same environment variables (DTRAIN_COORDINATOR, DTRAIN_TOKEN, DTRAIN_TLS_CA,
DTRAIN_TLS_CERT, DTRAIN_TLS_KEY), and every call's grpc.RpcError turned into a DtrainError."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, Union

import grpc

from dtrain.errors import InvalidArgument, from_rpc_error

DEFAULT_ADDRESS = "127.0.0.1:29610"


@dataclass
class TLS:
    """TLS settings: ``ca`` verifies the coordinator (None: the system's roots); ``cert`` and
    ``key`` are this client's certificate for a coordinator that requires one."""

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None


TLSArg = Union[None, bool, TLS]


def _read(path: Optional[str], what: str) -> Optional[bytes]:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, f"{what} '{path}': {e.strerror}")


class Connection:
    """One channel and the metadata every call carries."""

    def __init__(self, address: Optional[str], token: Optional[str], tls: TLSArg):
        self.address = address or os.environ.get("DTRAIN_COORDINATOR") or DEFAULT_ADDRESS
        token = token if token is not None else os.environ.get("DTRAIN_TOKEN", "")
        self.metadata: Tuple[Tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        if tls is None and os.environ.get("DTRAIN_TLS_CA"):
            tls = TLS(
                os.environ.get("DTRAIN_TLS_CA"),
                os.environ.get("DTRAIN_TLS_CERT"),
                os.environ.get("DTRAIN_TLS_KEY"),
            )
        if tls is True:
            tls = TLS()
        # Results over 4 MiB come in pages and chunks (the protocol keeps every message within
        # gRPC's defaults), so the channel keeps its default limits too.
        if isinstance(tls, TLS):
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls.ca, "tls ca"),
                private_key=_read(tls.key, "tls key"),
                certificate_chain=_read(tls.cert, "tls cert"),
            )
            self.channel = grpc.secure_channel(self.address, credentials)
        else:
            self.channel = grpc.insecure_channel(self.address)

    def call(self, method: Callable[..., Any], request: Any, timeout: Optional[float] = 10.0,
             **kwargs: Any) -> Any:
        """A unary call (or the start of a server stream) with the token and a deadline."""
        try:
            return method(request, timeout=timeout, metadata=self.metadata, **kwargs)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.address) from None

    def close(self) -> None:
        self.channel.close()
