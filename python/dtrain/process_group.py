"""ProcessGroup: one rank's handle on a coordinator group, the Python twin of the C++
dtrain::ProcessGroup (client/process_group.h) with the same wire protocol, so Python ranks and
C++ ranks (workers, the C++ library) can share a group.

    pg = dtrain.ProcessGroup("my-group", world_size=2)     # blocks until 2 ranks joined
    total = pg.all_reduce(np.ones(3, np.float32))          # numpy in, numpy out
    parts = pg.all_gather(torch.arange(pg.rank + 1))       # torch in, torch out; uneven dim 0

Every collective has a deadline (the group's default or ``timeout=`` seconds) and fails with
the C++ library's named errors: FailedPrecondition (ranks disagree: the message lists what each
called), DeadlineExceeded (the ranks that did not arrive), Aborted (a member died, named with its
host), InvalidArgument (this call's input), Unavailable (no coordinator). Collectives are
numbered in call order; every rank must issue the same collectives in the same order, as with
torch.distributed. Heartbeats go on their own channel from a background thread.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

import grpc
import numpy as np

from dtrain._connection import Connection, TLSArg
from dtrain.errors import (DtrainError, FailedPrecondition, InvalidArgument, error_for,
                           from_rpc_error)
from dtrain.v1 import coordinator_pb2 as pb
from dtrain.v1 import coordinator_pb2_grpc, tensor_pb2

# As client/process_group.h and common/streaming.h: all-reduces above SEGMENT_BYTES go as
# segments (each a collective of its own), and no message exceeds gRPC's default 4 MiB.
SEGMENT_BYTES = 4 << 20
MAX_SEGMENTS = 32
CHUNK_BYTES = (4 << 20) - (64 << 10)
_TRANSPORT_GRACE = 10.0
_SLOWEST_BYTES_PER_SECOND = 50e6
# A heartbeat that did not get through or was answered late: the coordinator may be busy or the
# network briefly down, and the next one may well be answered.
_TRANSPORT_TROUBLE = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE,
                      grpc.StatusCode.RESOURCE_EXHAUSTED)

_OPS = {
    "sum": pb.REDUCE_OP_SUM,
    "mean": pb.REDUCE_OP_MEAN,
    "avg": pb.REDUCE_OP_MEAN,
    "max": pb.REDUCE_OP_MAX,
    "min": pb.REDUCE_OP_MIN,
    "product": pb.REDUCE_OP_PRODUCT,
    "prod": pb.REDUCE_OP_PRODUCT,
}

_NUMPY_DTYPES = {
    np.dtype(np.float32): tensor_pb2.DTYPE_FLOAT32,
    np.dtype(np.float64): tensor_pb2.DTYPE_FLOAT64,
    np.dtype(np.float16): tensor_pb2.DTYPE_FLOAT16,
    np.dtype(np.int8): tensor_pb2.DTYPE_INT8,
    np.dtype(np.uint8): tensor_pb2.DTYPE_UINT8,
    np.dtype(np.int32): tensor_pb2.DTYPE_INT32,
    np.dtype(np.int64): tensor_pb2.DTYPE_INT64,
    np.dtype(np.bool_): tensor_pb2.DTYPE_BOOL,
}
_FROM_DTYPE = {v: k for k, v in _NUMPY_DTYPES.items()}

Array = Any  # a numpy.ndarray or a torch.Tensor
ReduceOpArg = Union[str, int]


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


def _encode(value: Array) -> Tuple[tensor_pb2.TensorMeta, bytes]:
    """(meta, little-endian bytes) of a numpy array or torch tensor (CPU copies as needed)."""
    if _is_torch(value):
        import torch

        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            meta = tensor_pb2.TensorMeta(dtype=tensor_pb2.DTYPE_BFLOAT16, shape=list(t.shape))
            return meta, t.view(torch.int16).numpy().tobytes()
        value = t.numpy()
    array = np.ascontiguousarray(value)
    dtype = _NUMPY_DTYPES.get(array.dtype.newbyteorder("="))  # any byte order: same element type
    if dtype is None:
        raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                              f"dtype {array.dtype} is not one dtrain carries; use float32, float64, "
                              "float16, bfloat16 (torch), int8, uint8, int32, int64 or bool")
    return tensor_pb2.TensorMeta(dtype=dtype, shape=list(array.shape)), array.astype(
        array.dtype.newbyteorder("<"), copy=False).tobytes()


def _decode(meta: tensor_pb2.TensorMeta, data: bytes, like_torch: bool) -> Array:
    shape = tuple(meta.shape)
    if meta.dtype == tensor_pb2.DTYPE_BFLOAT16:
        import torch

        raw = torch.frombuffer(bytearray(data), dtype=torch.int16) if data else torch.empty(0, dtype=torch.int16)
        return raw.view(torch.bfloat16).reshape(shape)
    array = np.frombuffer(data, dtype=_FROM_DTYPE[meta.dtype].newbyteorder("<")).reshape(shape)
    array = array.astype(_FROM_DTYPE[meta.dtype], copy=True)
    if like_torch:
        import torch

        return torch.from_numpy(array)
    return array


def _itemsize(dtype: int) -> int:
    return 2 if dtype == tensor_pb2.DTYPE_BFLOAT16 else _FROM_DTYPE[dtype].itemsize


def _op(op: ReduceOpArg) -> int:
    if isinstance(op, int):
        return op
    try:
        return _OPS[op.lower()]
    except KeyError:
        raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                              f"unknown reduce op '{op}'; use sum, mean, max, min or product") from None


class KeyValueStore:
    """The group's key-value scope (deleted when the group ends), as c10d's Store."""

    def __init__(self, conn: Connection, stub: coordinator_pb2_grpc.CoordinatorStub, scope: str):
        self._conn, self._stub, self._scope = conn, stub, scope

    def set(self, key: str, value: Union[bytes, str]) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        self._conn.call(self._stub.KeyValueSet,
                        pb.KeyValueSetRequest(scope=self._scope, key=key, value=data))

    def get(self, key: str, timeout: float = 0.0) -> bytes:
        """The value; waits up to ``timeout`` seconds for the key to appear (NotFound after)."""
        request = pb.KeyValueGetRequest(scope=self._scope, key=key,
                                        wait_timeout_ms=int(timeout * 1000))
        return self._conn.call(self._stub.KeyValueGet, request, timeout=timeout + _TRANSPORT_GRACE).value

    def add(self, key: str, delta: int) -> int:
        """Adds to a decimal counter (absent counts as 0); the new value."""
        return self._conn.call(self._stub.KeyValueAdd,
                               pb.KeyValueAddRequest(scope=self._scope, key=key, delta=delta)).value

    def compare_and_set(self, key: str, expected: bytes, desired: bytes) -> Tuple[bool, Optional[bytes]]:
        """Sets ``desired`` if the value is ``expected`` (b"" matches absent); (swapped, value now)."""
        r = self._conn.call(self._stub.KeyValueCompareAndSet, pb.KeyValueCompareAndSetRequest(
            scope=self._scope, key=key, expected=expected, desired=desired))
        return r.swapped, (r.value if r.present else None)

    def delete(self, key: str) -> bool:
        return self._conn.call(self._stub.KeyValueDelete,
                               pb.KeyValueDeleteRequest(scope=self._scope, key=key)).deleted

    def list(self, prefix: str = "") -> List[Tuple[str, bytes]]:
        """Every entry under ``prefix``, by key (all pages)."""
        out: List[Tuple[str, bytes]] = []
        token = ""
        while True:
            r = self._conn.call(self._stub.KeyValueList, pb.KeyValueListRequest(
                scope=self._scope, prefix=prefix, page_token=token))
            out.extend((e.key, e.value) for e in r.entries)
            if not r.next_page_token:
                return out
            if r.next_page_token == token:  # no progress: asking on would never end
                raise RuntimeError(
                    "the coordinator answered KeyValueList's page with its own token")
            token = r.next_page_token


class ProcessGroup:
    """Joins ``group`` and blocks until it forms (``world_size`` ranks, or for an elastic group
    at least ``min_world_size`` after ``settle_timeout`` seconds). Times are in seconds.
    ``member_list=False`` goes without ``members`` (RegisterRequest.omit_members): every rank's
    answer otherwise lists every rank, N² entries in all for a group of N."""

    def __init__(self, group: str, world_size: int, address: Optional[str] = None,
                 token: Optional[str] = None, tls: TLSArg = None, *, name: str = "",
                 host: Optional[str] = None, order_key: str = "", local_devices: int = 1,
                 min_world_size: int = 0, settle_timeout: float = 0.0,
                 register_timeout: float = 300.0, collective_timeout: Optional[float] = None,
                 heartbeats: bool = True, member_list: bool = True):
        self._conn = Connection(address, token, tls)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._conn.channel)
        # Heartbeats on their own connection, so a long transfer never delays them.
        self._control_conn = Connection(self._conn.address, token, tls)
        self._control = coordinator_pb2_grpc.CoordinatorStub(self._control_conn.channel)
        request = pb.RegisterRequest(
            group=group, host=host or socket.gethostname(), local_devices=local_devices,
            incarnation=random.getrandbits(63) | 1, world_size=world_size,
            min_world_size=min_world_size, settle_timeout_ms=int(settle_timeout * 1000),
            timeout_ms=int(register_timeout * 1000),
            collective_timeout_ms=int((collective_timeout or 0) * 1000), order_key=order_key,
            name=name, omit_members=not member_list)
        self._member_list = member_list
        # Waits for the connection (a coordinator starting up) within the join's deadline.
        self._assignment: pb.RegisterResponse = self._conn.call(
            self._stub.Register, request, timeout=register_timeout + _TRANSPORT_GRACE,
            wait_for_ready=True)
        self.group = group
        self.store = KeyValueStore(self._conn, self._stub, group)
        self._lock = threading.Lock()
        self._sequence = 0
        self._left = False
        self._health: Optional[DtrainError] = None
        self._stop = threading.Event()
        self._heartbeat_thread: Optional[threading.Thread] = None
        if heartbeats:
            self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop,
                                                      name=f"dtrain-heartbeat-{group}", daemon=True)
            self._heartbeat_thread.start()

    # -- who this rank is ---------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._assignment.rank

    @property
    def world_size(self) -> int:
        return self._assignment.world_size

    @property
    def local_rank(self) -> int:
        return self._assignment.local_rank

    @property
    def local_world_size(self) -> int:
        return self._assignment.local_world_size

    @property
    def node_rank(self) -> int:
        return self._assignment.node_rank

    @property
    def num_nodes(self) -> int:
        return self._assignment.num_nodes

    @property
    def generation(self) -> int:
        return self._assignment.generation

    @property
    def members(self) -> List[pb.MemberInfo]:
        if not self._member_list:
            raise RuntimeError(f"group {self.group!r} was joined with member_list=False: this "
                               "rank did not receive the member list")
        return list(self._assignment.members)

    def health(self) -> Optional[DtrainError]:
        """None while heartbeats succeed; otherwise the error the last one got (Aborted when a
        member died), or Unavailable once the coordinator has answered none for the heartbeat
        timeout. Late or lost heartbeats before that leave it unchanged; an answered one after
        Unavailable makes it None again."""
        return self._health

    # -- collectives ------------------------------------------------------------------------------
    def barrier(self, name: str = "barrier", timeout: Optional[float] = None) -> None:
        """Returns once every rank called barrier with the same name."""
        with self._lock:
            context, deadline = self._next_context(timeout, 0)
            self._unary(self._stub.Barrier, pb.BarrierRequest(context=context, name=name), deadline)

    def reduce_boolean_decision(self, decision: bool, all: bool = True,
                                timeout: Optional[float] = None) -> bool:
        """all=True: True iff every rank decided True; all=False: True iff any did."""
        with self._lock:
            context, deadline = self._next_context(timeout, 0)
            request = pb.ReduceBooleanDecisionRequest(context=context, decision=bool(decision), all=all)
            return self._unary(self._stub.ReduceBooleanDecision, request, deadline).decision

    def broadcast(self, tensor: Optional[Array], src: int = 0,
                  timeout: Optional[float] = None) -> Array:
        """Every rank receives src's tensor; the other ranks pass None (or anything, ignored
        unless it is a torch tensor: then the result is torch too)."""
        like_torch = _is_torch(tensor)
        with self._lock:
            meta, data = _encode(tensor) if self.rank == src and tensor is not None else (None, b"")
            context, deadline = self._next_context(timeout, len(data))
            header = pb.BroadcastHeader(context=context, src=src, kind=pb.PAYLOAD_KIND_TENSOR)
            if meta is not None:
                header.meta.CopyFrom(meta)
            parts = self._stream(self._stub.Broadcast, pb.BroadcastRequest, header, data, deadline)
        return _decode(parts[0][0], parts[0][1], like_torch)

    def broadcast_bytes(self, data: Optional[bytes], src: int = 0,
                        timeout: Optional[float] = None) -> bytes:
        """Every rank receives src's bytes (the C++ library's BroadcastBytes)."""
        with self._lock:
            payload = bytes(data) if self.rank == src and data is not None else b""
            context, deadline = self._next_context(timeout, len(payload))
            header = pb.BroadcastHeader(context=context, src=src, kind=pb.PAYLOAD_KIND_BYTES)
            if self.rank == src:
                header.meta.dtype = tensor_pb2.DTYPE_UINT8
                header.meta.shape.append(len(payload))
            parts = self._stream(self._stub.Broadcast, pb.BroadcastRequest, header, payload, deadline)
        return parts[0][1] if parts else b""

    def all_gather(self, tensor: Array, timeout: Optional[float] = None) -> List[Array]:
        """Every rank's tensor, in rank order. Dimension 0 may differ between ranks; the other
        dimensions and the dtype must agree."""
        like_torch = _is_torch(tensor)
        meta, data = _encode(tensor)
        with self._lock:
            context, deadline = self._next_context(timeout, len(data) * self.world_size)
            header = pb.AllGatherHeader(context=context, meta=meta)
            parts = self._stream(self._stub.AllGather, pb.AllGatherRequest, header, data, deadline)
        return [_decode(m, d, like_torch) for m, d in parts]

    def reduce(self, tensor: Array, dst: int = 0, op: ReduceOpArg = "sum",
               timeout: Optional[float] = None) -> Optional[Array]:
        """The reduction on rank ``dst``; None on the others."""
        like_torch = _is_torch(tensor)
        meta, data = _encode(tensor)
        with self._lock:
            context, deadline = self._next_context(timeout, len(data) * 2)
            header = pb.ReduceHeader(context=context, op=_op(op), dst=dst, meta=meta)
            parts = self._stream(self._stub.Reduce, pb.ReduceRequest, header, data, deadline)
        return _decode(parts[0][0], parts[0][1], like_torch) if parts else None

    def all_reduce(self, tensor: Array, op: ReduceOpArg = "sum",
                   timeout: Optional[float] = None) -> Array:
        """Every rank receives the reduction (sum, mean, max, min, product). Tensors over 4 MiB
        travel as segments, as the C++ library sends them, so mixed groups agree."""
        like_torch = _is_torch(tensor)
        meta, data = _encode(tensor)
        element = _itemsize(meta.dtype)
        size = len(data)
        segment = size
        if size > SEGMENT_BYTES:
            wanted = max(SEGMENT_BYTES, -(-size // MAX_SEGMENTS))
            segment = -(-wanted // element) * element
        count = 1 if size == 0 else -(-size // segment)
        out = bytearray(size)
        with self._lock:
            # Numbered together, as the C++ rank numbers the segments it sends at once.
            contexts = [self._next_context(timeout, size * 2) for _ in range(count)]
            refused = 0
            first_error: Optional[DtrainError] = None
            for i, (context, deadline) in enumerate(contexts):
                offset = i * segment
                piece = data[offset:offset + segment]
                header = pb.AllReduceHeader(context=context, op=_op(op))
                if count == 1:
                    header.meta.CopyFrom(meta)
                else:
                    header.meta.dtype = meta.dtype
                    header.meta.shape.append(len(piece) // element)
                    header.segment.index = i
                    header.segment.count = count
                    header.segment.whole.CopyFrom(meta)
                try:
                    parts = self._stream(self._stub.AllReduce, pb.AllReduceRequest, header, piece,
                                         deadline, settle=False)
                    out[offset:offset + len(piece)] = parts[0][1]
                except DtrainError as e:
                    if e.code == grpc.StatusCode.INVALID_ARGUMENT:
                        refused += 1
                    first_error = first_error or e
            self._sequence -= refused
            if first_error is not None:
                raise first_error
        return _decode(meta, bytes(out), like_torch)

    # -- leaving -----------------------------------------------------------------------------------
    def leave(self) -> None:
        """Leaves the group cleanly and stops heartbeats; later calls fail."""
        with self._lock:
            if self._left:
                return
            self._left = True
            self._stop.set()
            request = pb.LeaveRequest(member=self._assignment.member)
            try:
                self._conn.call(self._stub.Leave, request, timeout=_TRANSPORT_GRACE)
            finally:
                if self._heartbeat_thread is not None:
                    self._heartbeat_thread.join(timeout=5)
                self._conn.close()
                self._control_conn.close()

    close = leave

    def __enter__(self) -> "ProcessGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.leave()
        except DtrainError:
            if exc[0] is None:
                raise

    def __del__(self) -> None:
        # Heartbeats stop with the object; leaving cleanly is leave()'s (or `with`'s) job.
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    # -- internals ---------------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        interval = max(self._assignment.heartbeat_interval_ms, 10) / 1000.0
        # A heartbeat answered late or lost on the way is not a verdict: the coordinator declares
        # a member dead only after its heartbeat timeout without one, so the coordinator counts
        # as lost only after as long without any answer (as the C++ client does).
        patience = max(self._assignment.heartbeat_timeout_ms / 1000.0, interval * 2)
        # A slow coordinator is alive: each call waits up to a quarter of the patience, never
        # past the moment the verdict is due.
        per_call = max(interval * 2, patience / 4)
        last_answer = time.monotonic()
        request = pb.HeartbeatRequest(member=self._assignment.member)
        while not self._stop.wait(interval):
            left = patience - (time.monotonic() - last_answer)
            try:
                # The stub directly, not Connection.call: its advice for an unreachable
                # coordinator ("start a cluster") is for a first call, not a verdict mid-run.
                self._control.Heartbeat(request, metadata=self._control_conn.metadata,
                                        timeout=min(per_call, left) if left > 0.001 else per_call)
                self._health = None
                last_answer = time.monotonic()
            except grpc.RpcError as rpc:
                e = from_rpc_error(rpc)  # gRPC's own words: no address, no advice
                if e.code not in _TRANSPORT_TROUBLE:
                    last_answer = time.monotonic()  # a refusal is an answer too
                else:
                    silent = time.monotonic() - last_answer
                    if silent < patience:
                        continue
                    e = error_for(grpc.StatusCode.UNAVAILABLE, (
                        f"the coordinator at {self._conn.address} has answered no heartbeat for "
                        f"{silent:.3f}s (heartbeat timeout {patience:g}s; the last call: "
                        f"{e.message or e.code.name}): it is down, unreachable or overloaded"))
                self._health = e
                # A failed or finished group never recovers; stop talking to it.
                if e.code in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION,
                              grpc.StatusCode.NOT_FOUND):
                    return
            except ValueError:  # the channel was closed under us: the group was left
                return

    def _next_context(self, timeout: Optional[float], payload_bytes: int
                      ) -> Tuple[pb.CollectiveContext, float]:
        if self._left:
            raise FailedPrecondition(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"this rank left group '{self.group}'")
        context = pb.CollectiveContext(member=self._assignment.member, sequence=self._sequence,
                                       timeout_ms=int((timeout or 0) * 1000))
        self._sequence += 1
        seconds = timeout if timeout else self._assignment.collective_timeout_ms / 1000.0
        return context, seconds + _TRANSPORT_GRACE + payload_bytes / _SLOWEST_BYTES_PER_SECOND

    def _settle(self, error: DtrainError) -> DtrainError:
        # The coordinator checks a call's input before numbering it: a refused call gives its
        # sequence number back, or every later call of this rank would be out of step.
        if error.code == grpc.StatusCode.INVALID_ARGUMENT:
            self._sequence -= 1
        return error

    def _unary(self, method: Callable[..., Any], request: Any, deadline: float) -> Any:
        try:
            return method(request, timeout=deadline, metadata=self._conn.metadata)
        except grpc.RpcError as e:
            raise self._settle(from_rpc_error(e, self._conn.address)) from None

    def _stream(self, method: Callable[..., Any], request_type: Any, header: Any, data: bytes,
                deadline: float, settle: bool = True) -> List[Tuple[tensor_pb2.TensorMeta, bytes]]:
        """One tensor collective: header then chunks out; result header then chunks back,
        split into the parts the header lists."""

        def requests() -> Iterator[Any]:
            first = data[:CHUNK_BYTES]
            yield request_type(header=header, chunk=first)
            for offset in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
                yield request_type(chunk=data[offset:offset + CHUNK_BYTES])

        parts_meta: List[tensor_pb2.TensorMeta] = []
        received = bytearray()
        try:
            for i, response in enumerate(method(requests(), timeout=deadline,
                                                metadata=self._conn.metadata)):
                if i == 0:
                    parts_meta = list(response.header.parts)
                received += response.chunk
        except grpc.RpcError as e:
            error = from_rpc_error(e, self._conn.address)
            raise (self._settle(error) if settle else error) from None
        out: List[Tuple[tensor_pb2.TensorMeta, bytes]] = []
        offset = 0
        for meta in parts_meta:
            size = int(np.prod(meta.shape, dtype=np.int64)) * _itemsize(meta.dtype)
            out.append((meta, bytes(received[offset:offset + size])))
            offset += size
        if offset != len(received):
            raise DtrainError(grpc.StatusCode.INTERNAL,
                              "the coordinator's result stream does not match its header")
        return out
