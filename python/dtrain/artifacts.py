"""Files travel with the job, from Python as from the command line (client/spec_uploads.h):
the local files a spec names (the fields whose Setting option says FILE or CHECKPOINT:
model.torchscript, data.tensors_file, ckpt_path) are uploaded to
the coordinator's content-addressed store and the spec names them "artifact:sha256:<hex>".
"worker:/path" marks a file already on every worker and "job:<id>/<name>" a file another job
kept (both left alone); any other path must be a file here, or the submit is refused naming the
field. A data.shards split of the client's own shards (Setting path SHARDS) is uploaded shard
by shard and named by an uploaded list (dtrain.shard_upload); a URL is left alone. ``fetch``
brings a stored file back (a job's checkpoint), verified by its digest."""

from __future__ import annotations

import hashlib
import os
from typing import Iterator, List, Optional, Tuple

import grpc

from dtrain._connection import Connection
from dtrain.errors import DataLoss, InvalidArgument, NotFound, Unavailable, from_rpc_error
from dtrain.shard_upload import is_http_url, upload_shards
from dtrain.spec import path_fields
from dtrain.v1 import artifacts_pb2, artifacts_pb2_grpc, jobs_pb2, setting_pb2

CHUNK_BYTES = (4 << 20) - (64 << 10)


def digest_of(path: str) -> str:
    """"sha256:<hex>" of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def upload(conn: Connection, path: str, timeout: float = 60.0,
           digest: Optional[str] = None) -> Tuple[str, int, bool]:
    """Uploads ``path`` unless the coordinator has it: (digest, size, sent). ``digest``: the
    file's, when the caller has just computed it (the coordinator checks it either way)."""
    stub = artifacts_pb2_grpc.ArtifactsStub(conn.channel)
    size = os.path.getsize(path)
    digest = digest or digest_of(path)
    try:
        stored = conn.call(stub.Stat, artifacts_pb2.StatRequest(digest=digest), timeout=timeout)
        if stored.size == size:
            return digest, size, False
    except NotFound:
        pass

    def requests() -> Iterator[artifacts_pb2.UploadRequest]:
        header = artifacts_pb2.UploadHeader(digest=digest, size=size, name=os.path.basename(path))
        with open(path, "rb") as f:
            first = f.read(CHUNK_BYTES)
            yield artifacts_pb2.UploadRequest(header=header, chunk=first)
            for chunk in iter(lambda: f.read(CHUNK_BYTES), b""):
                yield artifacts_pb2.UploadRequest(chunk=chunk)

    try:
        response = stub.Upload(requests(), timeout=timeout + size / 50e6, metadata=conn.metadata)
    except grpc.RpcError as e:
        raise from_rpc_error(e, conn.address) from None
    return digest, size, not response.already_stored


def upload_spec_files(conn: Connection, spec: jobs_pb2.JobSpec) -> List[str]:
    """Uploads the spec's local files and shards and rewrites their paths; one line per file or
    split, as the CLI prints them."""
    lines = []
    for field, kind, message, attribute in list(path_fields(spec)):
        path = getattr(message, attribute)
        # A directory is never sent; a marked path is not the client's.
        if kind == setting_pb2.Setting.DIRECTORY or path.startswith(("worker:", "artifact:",
                                                                     "job:")):
            continue
        if kind == setting_pb2.Setting.SHARDS:
            if is_http_url(path):
                continue
            shards = upload_shards(conn, path, field)
            lines.append(shards.summary(field))
            setattr(message, attribute, shards.reference)
            continue
        if not os.path.isfile(path):
            raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"{field}: '{path}' is not a file here, so it cannot be sent "
                                  f"with the job; if it is already on every worker, write "
                                  f"worker:{path}")
        digest, size, sent = upload(conn, path)
        lines.append(f"{field}: {os.path.basename(path)} ({size / 1e6:.1f} MB) "
                     f"{'sent as' if sent else 'already on the coordinator as'} {digest}")
        setattr(message, attribute, f"artifact:{digest}")
    return lines


def fetch(conn: Connection, digest: str, path: str, timeout: float = 60.0,
          attempts: int = 3) -> str:
    """Streams the stored file ``digest`` to ``path`` (written atomically) and keeps it only if
    its bytes hash to ``digest``; a corrupted or broken transfer is tried again, ``attempts``
    in all, then raises DataLoss (or the transfer's error). Returns ``path``."""
    stub = artifacts_pb2_grpc.ArtifactsStub(conn.channel)
    size = conn.call(stub.Stat, artifacts_pb2.StatRequest(digest=digest), timeout=timeout).size
    temp = f"{path}.part-{os.getpid()}"
    for attempt in range(1, attempts + 1):
        h = hashlib.sha256()
        try:
            with open(temp, "wb") as out:
                for response in stub.Fetch(artifacts_pb2.FetchRequest(digest=digest),
                                           timeout=timeout + size / 50e6,
                                           metadata=conn.metadata):
                    h.update(response.chunk)
                    out.write(response.chunk)
            if "sha256:" + h.hexdigest() == digest:
                os.replace(temp, path)
                return path
            error: Exception = DataLoss(grpc.StatusCode.DATA_LOSS,
                                        f"the fetched bytes of {digest} hash to "
                                        f"sha256:{h.hexdigest()}; nothing was kept "
                                        f"(attempt {attempt} of {attempts})")
        except grpc.RpcError as e:
            error = from_rpc_error(e, conn.address)
        if os.path.exists(temp):
            os.remove(temp)
        if not isinstance(error, (DataLoss, Unavailable)) or attempt == attempts:
            raise error
    raise AssertionError("unreachable")
