"""Shard lists as WebDataset users write them, read exactly as the C++ side reads them
(common/shard_list.h): brace notation (``train-{000000..001023}.tar``, ``{a,b}``) and list
files with one shard per line, ``<shard> [sha256:<hex>] [samples:<n>]``. The client expands a
split of its own shards with these before it uploads them (dtrain.shard_upload), so Python and
the CLI must accept the same text, name the same shards in the same order and refuse the same
input with the same words (tests/python/test_shard_upload.py mirrors tests/shard_list_test.cc).
Every input is hostile: counts and name lengths are bounded before any name is made.

Pure functions; errors are dtrain.InvalidArgument."""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import List

import grpc

from dtrain.errors import InvalidArgument

# The most shards one list may name (common/shard_list.h kMaxShards), the longest name, and the
# bytes of a list file and of the names one list or pattern makes in all (kMaxShardListBytes).
MAX_SHARDS = 1 << 20
MAX_SHARD_NAME_BYTES = 4096
MAX_SHARD_LIST_BYTES = 256 << 20
# What to do about too many bytes of names, in the C++ side's words.
_SHARD_BYTES_ADVICE = " (name fewer or shorter shards, or split the data into several datasets)"

_ASCII_SPACE = " \t\n\v\f\r"  # absl::StripAsciiWhitespace's set, not Unicode's
_TOKEN_SEPARATORS = re.compile(r"[ \t]+")


def _bad(message: str) -> InvalidArgument:
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, message)


def _bytes(s: str) -> int:
    return len(s.encode("utf-8", "surrogateescape"))


def _bad_pattern(pattern: str, at: int, why: str) -> InvalidArgument:
    # The C++ side counts bytes; so does this, for the same "at character N" on any input.
    position = _bytes(pattern[:at]) + 1
    return _bad(f"shard pattern '{pattern}': {why} at character {position}")


def _all_digits(s: str) -> bool:
    # 18 digits fit in the C++ side's uint64_t; str.isdigit would take Unicode digits.
    return 0 < len(s) <= 18 and all("0" <= c <= "9" for c in s)


class _Group:
    """One brace group, kept unexpanded until the total count is known to be within bounds."""

    def __init__(self, pattern: str, at: int, prefix: str, body: str):
        self.prefix = prefix
        self.choices: List[str] = []
        self.lo = self.hi = self.width = 0
        if not body:
            raise _bad_pattern(pattern, at, "empty braces")
        dots = body.find("..")
        if dots >= 0 and "," not in body:
            lo, hi = body[:dots], body[dots + 2:]
            if not _all_digits(lo) or not _all_digits(hi):
                raise _bad_pattern(pattern, at,
                                   "a range's bounds must be decimal numbers ({0..99})")
            self.lo, self.hi = int(lo), int(hi)
            if self.lo > self.hi:
                raise _bad_pattern(pattern, at, "a range must go up ({lo..hi} with lo <= hi)")
            padded = (len(lo) > 1 and lo[0] == "0") or (len(hi) > 1 and hi[0] == "0")
            self.width = max(len(lo), len(hi)) if padded else 0
        else:
            self.choices = body.split(",")

    def count(self) -> int:
        return len(self.choices) if self.choices else self.hi - self.lo + 1

    def longest(self) -> int:
        if self.choices:
            return max(_bytes(c) for c in self.choices)
        return max(self.width, len(str(self.hi)))

    def bytes(self) -> int:
        """The bytes of all its values together, exactly: a range's values by their number of
        digits, each at least the padded width."""
        if self.choices:
            return sum(_bytes(c) for c in self.choices)
        n, low, high = 0, 0, 9  # the values of `digits` digits
        for digits in range(1, 20):
            first, last = max(low, self.lo), min(high, self.hi)
            if first <= last:
                n += (last - first + 1) * max(digits, self.width)
            low, high = high + 1, high * 10 + 9
        return n

    def values(self):
        if self.choices:
            return self.choices
        return (str(n).zfill(self.width) for n in range(self.lo, self.hi + 1))


def expand_shard_pattern(pattern: str, max_names: int = MAX_SHARDS,
                         max_bytes: int = MAX_SHARD_LIST_BYTES) -> List[str]:
    """Expands every ``{lo..hi}`` (decimal, lo <= hi; zero-padded to the wider bound when either
    bound has a leading zero, as WebDataset's braceexpand does) and ``{x,y,...}``, leftmost
    varying slowest. Braces do not nest. A pattern without braces is itself. InvalidArgument,
    naming the pattern and the position, for an unbalanced or empty brace, a reversed range, a
    bound that is not a number, more than ``max_names`` names or more than ``max_bytes`` bytes of
    them in all (both counted before any is made)."""
    groups: List[_Group] = []
    literal: List[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "}":
            raise _bad_pattern(pattern, i, "'}' without '{'")
        if c != "{":
            literal.append(c)
            i += 1
            continue
        close = pattern.find("}", i + 1)
        if close < 0:
            raise _bad_pattern(pattern, i, "'{' without '}'")
        body = pattern[i + 1:close]
        if "{" in body:
            raise _bad_pattern(pattern, i, "braces do not nest")
        groups.append(_Group(pattern, i, "".join(literal), body))
        literal = []
        i = close + 1
    tail = "".join(literal)
    # Bounds first: how many names, and how long the longest, before one is made.
    total = 1
    longest = _bytes(tail)
    for g in groups:
        if g.count() > max_names or total > max_names // g.count():
            raise _bad(f"shard pattern '{pattern}' names more than {max_names} shards")
        total *= g.count()
        longest += _bytes(g.prefix) + g.longest()
    if total > max_names:
        raise _bad(f"shard pattern '{pattern}' names more than {max_names} shards")
    if longest > MAX_SHARD_NAME_BYTES:
        raise _bad(f"shard pattern '{pattern}' makes names of {longest} bytes; at most "
                   f"{MAX_SHARD_NAME_BYTES}")
    # Each group's values appear total / count times each, the literals in every name.
    size = total * _bytes(tail) + sum(
        total * _bytes(g.prefix) + total // g.count() * g.bytes() for g in groups)
    if size > max_bytes:
        made = "more than 2^64" if size >= 1 << 64 else str(size)
        raise _bad(f"shard pattern '{pattern}' makes {made} bytes of names, over the {max_bytes} "
                   f"allowed here{_SHARD_BYTES_ADVICE}")
    prefixes = [g.prefix for g in groups]
    names = []
    for chosen in itertools.product(*(list(g.values()) for g in groups)):
        names.append("".join(p + v for p, v in zip(prefixes, chosen)) + tail)
    return names


def names_tar_shards(name: str) -> bool:
    """A name of tar shards, or a pattern of them: it ends in .tar, .tar.gz or .tgz (a list file
    or a directory does not)."""
    return name.endswith((".tar", ".tar.gz", ".tgz"))


@dataclasses.dataclass
class ShardEntry:
    """One shard of a list: a path or URL, its "sha256:<hex>" digest ("" when the list gives
    none) and its sample count (-1 when the list does not say)."""
    location: str
    digest: str = ""
    samples: int = -1


def parse_shard_list(text: str, max_shards: int = MAX_SHARDS,
                     max_bytes: int = MAX_SHARD_LIST_BYTES) -> List[ShardEntry]:
    """A list file's text: one shard per line, ``<location> [sha256:<hex>] [samples:<n>]`` (the
    tokens in any order); blank lines and lines starting with '#' are skipped; a location with
    neither token may use brace notation. At most ``max_shards`` in all, their locations at most
    ``max_bytes`` together. InvalidArgument naming the line (1-based) otherwise, and when the list
    names no shard."""
    shards: List[ShardEntry] = []
    size = 0  # of the locations so far
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.strip(_ASCII_SPACE)
        if not line or line[0] == "#":
            continue

        def bad(why: str) -> InvalidArgument:
            return _bad(f"shard list, line {number}: {why}")

        fields = [f for f in _TOKEN_SEPARATORS.split(line) if f]
        if len(fields) > 3:
            raise bad("expected '<shard> [sha256:<hex>] [samples:<n>]'")
        entry = ShardEntry(fields[0])
        for token in fields[1:]:
            if token.startswith("sha256:"):
                if entry.digest:
                    raise bad("two digests")
                hexdigits = token[len("sha256:"):]
                if len(hexdigits) != 64 or any(c not in "0123456789abcdef" for c in hexdigits):
                    raise bad("a digest is sha256: and 64 lowercase hex digits")
                entry.digest = token
            elif token.startswith("samples:"):
                if entry.samples >= 0:
                    raise bad("two sample counts")
                count = token[len("samples:"):]
                if not count or len(count) > 12 or any(not "0" <= c <= "9" for c in count):
                    raise bad("a sample count is samples: and a whole number below 10^12")
                entry.samples = int(count)
            else:
                raise bad(f"'{token}' is neither sha256:<hex> nor samples:<n>; expected "
                          "'<shard> [sha256:<hex>] [samples:<n>]'")
        if len(fields) > 1:
            if "{" in fields[0] or "}" in fields[0]:
                raise bad("a shard with a digest or a count names one file; braces would name "
                          "several")
            if _bytes(fields[0]) > MAX_SHARD_NAME_BYTES:
                raise bad("the shard's name is too long")
            if len(shards) >= max_shards:
                raise bad(f"more than {max_shards} shards")
            if _bytes(fields[0]) > max_bytes - size:
                raise bad(f"the list's names pass {max_bytes} bytes in all{_SHARD_BYTES_ADVICE}")
            size += _bytes(fields[0])
            shards.append(entry)
            continue
        try:
            names = expand_shard_pattern(fields[0], max_shards - len(shards), max_bytes - size)
        except InvalidArgument as e:
            raise bad(e.message) from None
        size += sum(_bytes(name) for name in names)
        shards.extend(ShardEntry(name) for name in names)
    if not shards:
        raise _bad("shard list names no shard (only blank lines or comments)")
    return shards


def format_shard_entry(entry: ShardEntry) -> str:
    """The entry as a list file's line (without the newline): the location, then the digest and
    the count when known, the order dtrain's writers use."""
    return entry.location + (f" {entry.digest}" if entry.digest else "") + \
        (f" samples:{entry.samples}" if entry.samples >= 0 else "")

