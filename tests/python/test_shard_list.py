"""Shard patterns, list files and tar sample counts from Python (dtrain.shard_list,
dtrain.tar_samples), read exactly as the C++ side reads them: these cases are
tests/shard_list_test.cc's, with the same names, orders and error words, and the tar cases are
the ones libarchive (common/tar_sample_count.cc) counts or refuses. No cluster."""

import gzip
import io
import os
import tarfile

import pytest

from dtrain.errors import DataLoss, InvalidArgument, NotFound
from dtrain.shard_list import (MAX_SHARD_NAME_BYTES, ShardEntry, expand_shard_pattern,
                               format_shard_entry, names_tar_shards, parse_shard_list)
from dtrain.spec import lexically_normal
from dtrain.tar_samples import count_tar_samples, split_member_name


def refused(call, *args):
    with pytest.raises(InvalidArgument) as e:
        call(*args)
    return e.value.message


def test_zero_padded_range_as_webdataset_writes_them():
    assert expand_shard_pattern("train-{000008..000011}.tar") == [
        "train-000008.tar", "train-000009.tar", "train-000010.tar", "train-000011.tar"]
    # Without a leading zero, no padding; padding takes the wider bound.
    assert expand_shard_pattern("s{8..11}") == ["s8", "s9", "s10", "s11"]
    assert "s008" in expand_shard_pattern("s{08..100}")
    assert expand_shard_pattern("s{08..100}")[-1] == "s100"
    names = expand_shard_pattern("train-{000000..001023}.tar")
    assert len(names) == 1024 and names[-1] == "train-001023.tar"
    assert expand_shard_pattern("{0..0}") == ["0"]


def test_choices_and_several_groups_leftmost_varying_slowest():
    assert expand_shard_pattern("https://h/{a,b}/p-{0..2}.tar") == [
        "https://h/a/p-0.tar", "https://h/a/p-1.tar", "https://h/a/p-2.tar",
        "https://h/b/p-0.tar", "https://h/b/p-1.tar", "https://h/b/p-2.tar"]
    assert expand_shard_pattern("/data/one.tar") == ["/data/one.tar"]
    # An empty choice is a choice; a choice holding ".." is text, not a range.
    assert expand_shard_pattern("x{a,}.tar") == ["xa.tar", "x.tar"]
    assert expand_shard_pattern("{1..2,b}") == ["1..2", "b"]


@pytest.mark.parametrize("pattern,why", [
    ("a{0..3", "'{' without '}' at character 2"),
    ("a}b", "'}' without '{' at character 2"),
    ("a{}b", "empty braces"),
    ("a{5..2}", "must go up"),
    ("a{x..9}", "decimal numbers"),
    ("a{-1..9}", "decimal numbers"),
    ("a{{0..1}}", "do not nest"),
    ("a{0..1234567890123456789}", "decimal numbers"),  # 19 digits: the C++ side's uint64_t
    ("a{1..2..3}", "decimal numbers"),
    ("a{٣..٥}", "decimal numbers"),  # Arabic-Indic digits are not decimal here
])
def test_malformed_invalid_argument_naming_where_and_why(pattern, why):
    message = refused(expand_shard_pattern, pattern)
    assert why in message and pattern in message
    assert message.startswith(f"shard pattern '{pattern}': ")


def test_positions_are_bytes_as_the_cpp_side_counts():
    assert refused(expand_shard_pattern, "é{0..1").endswith("at character 3")


def test_huge_counts_refused_before_allocating():
    for pattern in ("s{0..999999999999999999}", "{0..999999}-{0..999999}",
                    "{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}{0..9}"):
        assert refused(expand_shard_pattern, pattern) == \
            f"shard pattern '{pattern}' names more than 1048576 shards"
    refused(expand_shard_pattern, "{0..9}{0..9}", 99)
    assert len(expand_shard_pattern("{0..9}{0..9}", 100)) == 100
    long_name = "x" * MAX_SHARD_NAME_BYTES
    assert "makes names of 4097 bytes" in refused(expand_shard_pattern, long_name + "{0..1}")
    # 2^20 exactly is allowed.
    assert len(expand_shard_pattern("{0..1023}{0..1023}")) == 1 << 20


def test_bytes_of_names_in_all_refused_before_allocating():
    # Each bound alone holds, but together they would make 4 GiB of names from a 4 KB line.
    message = refused(expand_shard_pattern, "a" * 4000 + "{0..1048575}")
    assert ("bytes of names, over the 268435456 allowed here (name fewer or shorter shards"
            in message)
    assert len(expand_shard_pattern("ab{0..9}", 100, 30)) == 10
    assert "makes 30 bytes of names, over the 29 allowed here" in \
        refused(expand_shard_pattern, "ab{0..9}", 100, 29)
    # A range's values count at their own digits, padded ones at the padding.
    assert len(expand_shard_pattern("{8..11}", 100, 6)) == 4
    assert "makes 6 bytes" in refused(expand_shard_pattern, "{8..11}", 100, 5)
    assert len(expand_shard_pattern("{08..11}", 100, 8)) == 4
    assert "makes 8 bytes" in refused(expand_shard_pattern, "{08..11}", 100, 7)
    assert len(expand_shard_pattern("{a,bbb}-{0,1}", 100, 16)) == 4
    refused(expand_shard_pattern, "{a,bbb}-{0,1}", 100, 15)
    assert "makes more than 2^64 bytes of names" in refused(
        expand_shard_pattern, "x" * 4000 + "{0..99999999999999999}", 1 << 64)


def test_names_tar_shards():
    assert names_tar_shards("a-{0..3}.tar") and names_tar_shards("a.tar.gz")
    assert names_tar_shards("a.tgz")
    assert not names_tar_shards("shards/") and not names_tar_shards("list.txt")
    assert not names_tar_shards("a.TAR")  # as the C++ side: case matters


def test_list_lines_with_digests_comments_and_patterns():
    digest = "sha256:" + "a" * 64
    entries = parse_shard_list(
        f"# ImageNet, first shards\n\n  https://h/a.tar  {digest}\nworker:/d/b-{{1..2}}.tar\r\n")
    assert entries == [ShardEntry("https://h/a.tar", digest, -1),
                       ShardEntry("worker:/d/b-1.tar"), ShardEntry("worker:/d/b-2.tar")]


def test_sample_counts_in_either_order():
    digest = "sha256:" + "b" * 64
    entries = parse_shard_list(f"a.tar samples:1000 {digest}\nb.tar samples:7\nc.tar {digest}")
    assert entries == [ShardEntry("a.tar", digest, 1000), ShardEntry("b.tar", "", 7),
                       ShardEntry("c.tar", digest, -1)]
    assert [format_shard_entry(e) for e in entries] == [
        f"a.tar {digest} samples:1000", "b.tar samples:7", f"c.tar {digest}"]


@pytest.mark.parametrize("text,want", [
    ("a.tar\nb.tar sha256:12\n", "line 2: a digest is sha256: and 64 lowercase hex"),
    ("a.tar md5:" + "0" * 32, "line 1: 'md5:0000"),
    ("a.tar sha256:" + "A" * 64, "line 1: a digest"),
    ("a.tar x y z", "line 1: expected '<shard> [sha256:<hex>] [samples:<n>]'"),
    ("a.tar x", "line 1: 'x' is neither sha256:<hex> nor samples:<n>"),
    ("a.tar samples:-1", "line 1: a sample count is samples: and a whole number"),
    ("a.tar samples:+3", "line 1: a sample count"),
    ("a.tar samples:1000000000000", "line 1: a sample count"),
    ("a.tar samples:1 samples:2", "line 1: two sample counts"),
    ("a.tar sha256:" + "0" * 64 + " sha256:" + "1" * 64, "line 1: two digests"),
    ("a-{0..1}.tar samples:3", "braces would name several"),
    ("a-{0..1}.tar sha256:" + "0" * 64, "braces would name several"),
    ("ok.tar\nbad{.tar", "line 2: shard pattern 'bad{.tar': '{' without '}'"),
    ("# nothing\n\n", "names no shard"),
    ("", "names no shard"),
])
def test_bad_lines_invalid_argument_naming_the_line(text, want):
    assert want in refused(parse_shard_list, text)


def test_the_bound_counts_every_line():
    assert len(parse_shard_list("a{0..4}\nb{0..4}", 10)) == 10
    assert "line 2" in refused(parse_shard_list, "a{0..4}\nb{0..5}", 10)
    assert "line 3: more than 2 shards" in refused(parse_shard_list,
                                                   "a\nb\nc sha256:" + "0" * 64, 2)


def test_the_bytes_bound_counts_every_line():
    digest = " sha256:" + "0" * 64
    assert len(parse_shard_list("aaaa\nb{0,1}\ncc" + digest, 10, 10)) == 4
    assert "line 3: the list's names pass 9 bytes in all (name fewer" in refused(
        parse_shard_list, "aaaa\nb{0,1}\ncc" + digest, 10, 9)
    assert ("line 2: shard pattern 'b{0,1,2}' makes 6 bytes of names, over the 5 allowed"
            in refused(parse_shard_list, "aaaa\nb{0,1,2}", 10, 9))


def test_lexically_normal_is_the_cpp_sides():
    # Checked against libstdc++'s std::filesystem::path::lexically_normal (8515 generated
    # paths when written); these are the cases os.path.normpath writes differently.
    cases = {"/a/b/": "/a/b/", "/a/b/..": "/a/", "/a/b/.": "/a/b/", "a/./": "a/",
             "a/../..": "..", "../x": "../x", ".": ".", "./": ".", "/..": "/", "/../a": "/a",
             "a/..": ".", "a//b/": "a/b/", "x/y/../": "x/", "/a/./b/./": "/a/b/", "...": "...",
             "../": "..", "/": "/", "/base/dir/shards/": "/base/dir/shards/"}
    for path, want in cases.items():
        assert lexically_normal(path) == want, path


def _member(tar, name, data=b"x", kind=tarfile.REGTYPE, link=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE) else 0
    tar.addfile(info, io.BytesIO(data) if info.size else None)


def _shard(samples=3, size=1000):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for k in range(samples):
            for field in ("cls", "npy"):
                _member(tar, f"k{k}.{field}", bytes(size))
    return out.getvalue()


def _write(tmp_path, name, data):
    path = os.path.join(str(tmp_path), name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_member_names_split_as_webdataset_splits_them():
    assert split_member_name("dir/a.b.JPG") == ("dir/a", "b.jpg")
    assert split_member_name("d.x/a") is None  # no '.' in the last component
    assert split_member_name("d/.hidden") is None
    assert split_member_name("d/a.") is None
    assert split_member_name("a.É") == ("a", "É")  # ASCII lowercasing only, as the C++ side


def test_counts_samples_from_headers_regular_members_only(tmp_path):
    good = _shard()
    assert count_tar_samples(_write(tmp_path, "good.tar", good)) == 3
    assert count_tar_samples(_write(tmp_path, "good.tar.gz", gzip.compress(good))) == 3
    # Links, directories and FIFOs are not samples; names without a field are not either;
    # consecutive members of one key are one sample, a key seen again later is another.
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        _member(tar, "a.cls")
        _member(tar, "a.npy")
        _member(tar, "b.cls", kind=tarfile.LNKTYPE, link="a.cls")
        _member(tar, "c.cls", kind=tarfile.SYMTYPE, link="a.cls")
        _member(tar, "d", kind=tarfile.DIRTYPE)
        _member(tar, "e.x", kind=tarfile.AREGTYPE)
        _member(tar, "f.x", kind=tarfile.CONTTYPE)
        _member(tar, "g.x", kind=tarfile.FIFOTYPE)
        _member(tar, "h/.hidden")
        _member(tar, "i.")
        _member(tar, "noext")
        _member(tar, "a.json")
    assert count_tar_samples(_write(tmp_path, "odd.tar", out.getvalue())) == 4
    # The end-of-archive marker is optional; an all-zero file is an empty archive.
    last = good.index(b"k2.npy")
    end = last + 512 + 1024  # its header, then 1000 bytes padded to 1024
    assert count_tar_samples(_write(tmp_path, "nomarker.tar", good[:end])) == 3
    assert count_tar_samples(_write(tmp_path, "zeros.tar", bytes(10240))) == 0


def test_damaged_shards_data_loss_naming_the_shard(tmp_path):
    good = _shard()
    end = good.index(b"k2.npy") + 512 + 1024
    damaged_header = bytearray(good)
    at = good.index(b"k2.cls")
    damaged_header[at:at + 20] = b"\xff" * 20
    cases = {
        "cut-in-data.tar": (good[:512 * 3 + 700], "after 1 samples"),
        "cut-in-header.tar": (good[:good.index(b"k1.cls") + 290], "after 1 samples: truncated"),
        "bad-header.tar": (bytes(damaged_header), "after 2 samples: damaged header at byte"),
        "garbage-after.tar": (good[:end] + b"garbage".ljust(512, b"x"), "after 3 samples"),
        "partial-block.tar": (good[:end] + bytes(100), "after 3 samples: truncated"),
        "cut.tar.gz": (gzip.compress(good)[:-5], "after"),
        "cut-inside.tar.gz": (gzip.compress(good[:3000]), "after 1 samples"),
        "empty.tar": (b"", "not a tar archive"),
        "text.tar": (b"hello world\n" * 100, "not a tar archive"),
    }
    for name, (data, want) in cases.items():
        path = _write(tmp_path, name, data)
        with pytest.raises(DataLoss) as e:
            count_tar_samples(path)
        assert e.value.message.startswith(f"shard '{path}'"), name
        assert want in e.value.message, (name, e.value.message)
    with pytest.raises(NotFound) as e:
        count_tar_samples(os.path.join(str(tmp_path), "missing.tar"))
    assert "missing.tar" in e.value.message
