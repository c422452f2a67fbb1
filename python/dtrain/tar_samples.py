"""A tar shard's sample count from its headers, as the C++ side counts it
(common/tar_sample_count.h, with libarchive): WebDataset's grouping, where consecutive regular
members whose paths share a key (the path up to the first '.' of its last component) are one
sample. The client counts the shards it uploads, so every rank can plan its part of an epoch
before reading any; Python and the CLI must give the same count for the same shard, and refuse
the same damaged shards (a truncated member, a damaged header, bytes that are not a tar).
Members' data is skipped, never read (tarfile seeks over it; a .tar.gz is decompressed as it
is walked). Pure functions; errors are dtrain.NotFound and dtrain.DataLoss, naming the shard."""

from __future__ import annotations

import gzip
import os
import tarfile
import zlib
from typing import Optional, Tuple

import grpc

from dtrain.errors import DataLoss, NotFound

_BLOCK = 512
_UPPER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def split_member_name(path: str) -> Optional[Tuple[str, str]]:
    """A member's (sample key, field) as WebDataset splits them: the key is the path up to the
    first '.' of its last component, the field the rest, lowercased (ASCII only, as the C++
    side). None for a last component with no '.', one starting with '.', or ending in it."""
    base = path.rfind("/") + 1
    dot = path.find(".", base)
    if dot < 0 or dot == base or dot + 1 == len(path):
        return None
    return path[:dot], path[dot + 1:].translate(_UPPER)


def count_tar_samples(path: str) -> int:
    """Samples in a local tar shard (uncompressed or gzip), by walking its headers. NotFound for
    a missing file; DataLoss for one that is not a tar or is damaged, naming it and how many
    samples came before the damage."""
    try:
        file = open(path, "rb")
    except FileNotFoundError:
        raise NotFound(grpc.StatusCode.NOT_FOUND,
                       f"shard '{path}': no such file") from None
    except OSError as e:
        raise DataLoss(grpc.StatusCode.DATA_LOSS, f"shard '{path}': {e.strerror}") from None
    samples = 0
    with file:
        # Gzip or nothing, as the C++ side's libarchive is configured (not bzip2, not xz).
        stream = gzip.GzipFile(fileobj=file, mode="rb") if file.read(2) == b"\x1f\x8b" else file
        file.seek(0)
        try:
            tar = tarfile.open(fileobj=stream, mode="r:")
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            raise DataLoss(grpc.StatusCode.DATA_LOSS,
                           f"shard '{path}': not a tar archive ({e})") from None
        try:
            with tar:
                last: Optional[str] = None
                while True:
                    member = tar.next()
                    if member is None:
                        break
                    if not member.isreg():
                        continue
                    split = split_member_name(member.name)
                    if split is not None and split[0] != last:
                        samples += 1
                        last = split[0]
                    # tarfile keeps every member it read; a count needs none of them.
                    tar.members.clear()
                end = tar.offset  # where the header after the last member is, or would be
            _check_end(stream, end)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            raise DataLoss(grpc.StatusCode.DATA_LOSS,
                           f"shard '{path}' after {samples} samples: {e}") from None
    return samples


class _Damaged(tarfile.TarError):
    pass


def _check_end(stream, end: int) -> None:
    """tarfile ends its walk quietly at a header it cannot read or at a member cut short;
    libarchive calls both damage. So what follows the last member must be the end: nothing, or
    a zero block (the end-of-archive marker)."""
    length = stream.seek(0, os.SEEK_END)
    if length < end:
        raise _Damaged(f"truncated: the last member needs {end} bytes, the archive has {length}")
    stream.seek(end)
    block = stream.read(_BLOCK)
    if 0 < len(block) < _BLOCK:
        raise _Damaged(f"truncated: a header of {len(block)} bytes at byte {end}")
    if block and block.count(0) != _BLOCK:
        raise _Damaged(f"damaged header at byte {end}")
