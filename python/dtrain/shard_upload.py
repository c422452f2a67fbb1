"""The client's own shards travel with the job, from Python as from the command line
(client/shard_upload.h): a data.shards split that names local files (a brace pattern, a
directory of *.tar / *.tar.gz / *.tgz, or a list file) has each shard counted and uploaded to
the coordinator's content-addressed store (once: a shard the store has is not sent again), and
is replaced by an uploaded list file whose lines name each shard by content with its digest and
sample count (``artifact:sha256:<hex> sha256:<hex> samples:<n>``). A worker fetches a shard when
its rank reads it, never the whole dataset. Entries of a list that are URLs or worker paths are
kept as they are. The list's text is byte for byte the CLI's, so both clients upload the same
list artifact for the same shards named the same way.

One call at a time per connection."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import List

import grpc

from dtrain._connection import Connection
from dtrain.errors import DataLoss, DtrainError, InvalidArgument, NotFound, error_for
from dtrain.shard_list import (MAX_SHARD_LIST_BYTES, ShardEntry, expand_shard_pattern,
                               format_shard_entry, names_tar_shards, parse_shard_list)
from dtrain.spec import is_http_url, lexically_normal
from dtrain.tar_samples import count_tar_samples

_MARKS = ("worker:", "artifact:", "job:")  # common/file_reference.h


def is_marked(s: str) -> bool:
    """A path the client does not read: "artifact:", "worker:" or "job:"."""
    return s.startswith(_MARKS)


@dataclasses.dataclass
class ShardUpload:
    """What upload_shards did: the list's reference and the shards' totals."""
    reference: str  # "artifact:sha256:<hex>" of the uploaded list
    shards: int = 0
    sent: int = 0     # shards sent now (the others were stored already)
    bytes: int = 0    # of the local shards
    samples: int = 0

    def summary(self, field: str) -> str:
        """The CLI's line for it: "data.shards.train: 4 shards, 256 samples (1.6 MB), 4 sent,
        the list as artifact:sha256:..."."""
        return (f"{field}: {self.shards} shards, {self.samples} samples "
                f"({self.bytes / 1e6:.1f} MB), {self.sent} sent, the list as {self.reference}")


def _in_field(field: str, error: DtrainError) -> DtrainError:
    return error_for(error.code, f"{field}: {error.message}")


def local_entries(value: str, field: str) -> List[ShardEntry]:
    """The shards ``value`` names: a pattern of tar shards, a directory's tar shards (sorted, no
    hidden files), or a list file's entries (relative ones against the list's directory).
    NotFound for a name that is none of these or a directory without shards; InvalidArgument
    for a malformed pattern or list, naming ``field``."""
    if names_tar_shards(value):
        try:
            return [ShardEntry(n) for n in expand_shard_pattern(value)]
        except InvalidArgument as e:
            raise _in_field(field, e) from None
    if os.path.isdir(value):
        names = sorted(os.path.join(value, name) for name in os.listdir(value)
                       if names_tar_shards(name) and not name.startswith(".")
                       and os.path.isfile(os.path.join(value, name)))
        if not names:
            raise NotFound(grpc.StatusCode.NOT_FOUND,
                           f"{field}: directory '{value}' holds no tar shards (*.tar, *.tar.gz, "
                           "*.tgz)")
        return [ShardEntry(n) for n in names]
    try:
        size = os.path.getsize(value)
    except OSError:
        raise NotFound(grpc.StatusCode.NOT_FOUND,
                       f"{field}: '{value}' is neither tar shards (*.tar), a directory nor a list "
                       f"file here; if it is on every worker, write worker:{value}") from None
    if size > MAX_SHARD_LIST_BYTES:
        raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{field}: list file '{value}' has {size} bytes; a shard list has "
                              f"at most {MAX_SHARD_LIST_BYTES} (split the data into several "
                              "datasets)")
    with open(value, "rb") as f:
        text = f.read().decode("utf-8", "surrogateescape")
    try:
        entries = parse_shard_list(text)
    except InvalidArgument as e:
        raise _in_field(f"{field}: list file '{value}'", e) from None
    directory = os.path.dirname(value)
    for e in entries:
        if not is_http_url(e.location) and not is_marked(e.location) \
                and not e.location.startswith("/"):
            e.location = lexically_normal(os.path.join(directory, e.location))
    return entries


def list_header(field: str, value: str) -> str:
    """The uploaded list's first line, the CLI's: it says where the list came from."""
    return f"# {field}: {value}, uploaded by dtrain\n"


def upload_shards(conn: Connection, value: str, field: str) -> ShardUpload:
    """Counts and uploads the local shards ``value`` names, then their list; ``field``
    ("data.shards.train") starts every message. NotFound or InvalidArgument naming the shard
    that is missing or malformed; DataLoss for a shard whose bytes are not the digest its list
    gives, or a damaged tar."""
    from dtrain.artifacts import digest_of, upload  # artifacts imports this module

    entries = local_entries(value, field)
    out = ShardUpload(reference="")
    lines = [list_header(field, value)]
    for e in entries:
        if is_http_url(e.location) or is_marked(e.location):
            lines.append(format_shard_entry(e) + "\n")
            out.shards += 1
            out.samples += max(e.samples, 0)
            continue
        if not os.path.isfile(e.location):
            raise NotFound(grpc.StatusCode.NOT_FOUND,
                           f"{field}: shard '{e.location}' is not a file here")
        samples = e.samples
        if samples < 0:
            try:
                samples = count_tar_samples(e.location)
            except DtrainError as error:
                raise _in_field(field, error) from None
        digest = digest_of(e.location)
        # Checked before sending, so a shard its list does not describe is never stored.
        if e.digest and e.digest != digest:
            raise DataLoss(grpc.StatusCode.DATA_LOSS,
                           f"{field}: shard '{e.location}' has digest {digest}, its list says "
                           f"{e.digest}")
        try:
            _, size, sent = upload(conn, e.location, digest=digest)
        except DtrainError as error:
            raise error_for(error.code,
                            f"{field}: uploading '{e.location}': {error.message}") from None
        lines.append(f"artifact:{digest} {digest} samples:{samples}\n")
        out.shards += 1
        out.sent += 1 if sent else 0
        out.bytes += size
        out.samples += samples
    # The list itself travels as an artifact, written where the client may write.
    handle, temporary = tempfile.mkstemp(prefix="dtrain-shards-", suffix=".txt")
    try:
        with os.fdopen(handle, "wb") as f:
            f.write("".join(lines).encode("utf-8", "surrogateescape"))
        try:
            digest, _, _ = upload(conn, temporary)
        except DtrainError as error:
            raise error_for(error.code,
                            f"{field}: uploading its shard list: {error.message}") from None
    finally:
        os.remove(temporary)
    out.reference = f"artifact:{digest}"
    return out
