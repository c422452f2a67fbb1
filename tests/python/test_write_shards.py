"""dtrain.data.write_shards: datasets to WebDataset shards, read back member by member.

webdataset (pip) is not a Debian package, so it is not used here: `read_samples` reads a shard
with tarfile the way webdataset's tar_file_expander and group_by_keys do (consecutive members
grouped by the key up to the first '.' of the name, the rest lowercased as the field). Needs
Debian's python3-torch, python3-torchvision and python3-pil; no cluster.
"""

import glob
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

import numpy
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset, TensorDataset
from torchvision.datasets import ImageFolder

from dtrain.data import ShardSet, write_shards

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIST_LINE = re.compile(r"(\S+) sha256:([0-9a-f]{64}) samples:(\d+)")


def read_samples(path):
    """[(key, {field: bytes})] in shard order, grouped as webdataset groups members."""
    samples = []
    with tarfile.open(path) as tar:
        for member in tar:
            assert member.isreg(), f"{member.name} is not a regular file"
            assert member.mtime == 0 and member.uid == 0 and member.gid == 0
            assert member.mode == 0o644 and member.uname == "" and member.gname == ""
            key, field = member.name.split(".", 1)
            field = field.lower()
            if not samples or samples[-1][0] != key:
                samples.append((key, {}))
            assert field not in samples[-1][1], f"{member.name} twice"
            samples[-1][1][field] = tar.extractfile(member).read()
    return samples


def read_all(shards: ShardSet):
    return [s for path in shards.paths for s in read_samples(path)]


def npy(data):
    return numpy.load(io.BytesIO(data), allow_pickle=False)


def test_tensor_dataset_round_trips_keys_fields_and_values(tmp_path):
    x = torch.randn(25, 3, 4)
    y = torch.arange(100, 125)
    shards = write_shards(TensorDataset(x, y), str(tmp_path), samples_per_shard=10)

    assert [os.path.basename(p) for p in shards.paths] == [
        "shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert shards.pattern == "shard-{000000..000002}.tar"
    assert shards.samples == 25
    assert [len(read_samples(p)) for p in shards.paths] == [10, 10, 5]  # the last is shorter
    samples = read_all(shards)
    assert [key for key, _ in samples] == [f"{i:09d}" for i in range(25)]
    for i, (key, fields) in enumerate(samples):
        assert sorted(fields) == ["cls", "npy"]
        array = npy(fields["npy"])
        assert array.dtype == numpy.float32 and array.dtype.byteorder in ("<", "=")
        numpy.testing.assert_array_equal(array, x[i].numpy())
        assert fields["cls"] == str(100 + i).encode()
        assert int(fields["cls"]) == y[i].item()


def test_list_file_has_each_shards_digest_and_count(tmp_path):
    shards = write_shards(TensorDataset(torch.arange(23)), str(tmp_path), samples_per_shard=5,
                          prefix="train")
    assert shards.list_file == str(tmp_path / "train.txt")
    with open(shards.list_file) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("# written by dtrain.data.write_shards")
    entries = [LIST_LINE.fullmatch(line) for line in lines[1:]]
    assert all(entries), lines
    assert [m.group(1) for m in entries] == [os.path.basename(p) for p in shards.paths]
    for m, path, digest in zip(entries, shards.paths, shards.digests):
        with open(path, "rb") as f:
            actual = hashlib.sha256(f.read()).hexdigest()
        assert m.group(2) == actual and digest == f"sha256:{actual}"
        assert int(m.group(3)) == len(read_samples(path))
    assert [int(m.group(3)) for m in entries] == [5, 5, 5, 5, 3]
    assert sum(int(m.group(3)) for m in entries) == 23


def make_image_folder(root, classes=3, per_class=4):
    """A torchvision ImageFolder of generated PNGs of varied sizes and content."""
    rng = numpy.random.default_rng(7)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class_{c}"))
        for i in range(per_class):
            h, w = 20 + 3 * i + c, 30 + 5 * c + i
            yy, xx = numpy.mgrid[0:h, 0:w]
            pixels = numpy.stack([xx * 255 // w, yy * 255 // h, (xx + yy + 40 * c) % 256], -1)
            pixels = (pixels + rng.integers(0, 8, pixels.shape)).clip(0, 255).astype(numpy.uint8)
            Image.fromarray(pixels).save(os.path.join(root, f"class_{c}", f"img_{i}.png"))
    return ImageFolder(root)


def test_image_folder_as_png_is_lossless(tmp_path):
    dataset = make_image_folder(str(tmp_path / "images"))
    shards = write_shards(dataset, str(tmp_path / "shards"), samples_per_shard=5,
                          image_format="png")
    samples = read_all(shards)
    assert len(samples) == len(dataset) == 12
    for i, (key, fields) in enumerate(samples):
        image, label = dataset[i]
        assert sorted(fields) == ["cls", "png"]
        decoded = Image.open(io.BytesIO(fields["png"]))
        assert decoded.format == "PNG" and decoded.mode == "RGB"
        numpy.testing.assert_array_equal(numpy.asarray(decoded), numpy.asarray(image))
        assert int(fields["cls"]) == label
    assert sorted({int(f["cls"]) for _, f in samples}) == [0, 1, 2]


def test_image_folder_as_jpeg_decodes_to_the_same_size(tmp_path):
    dataset = make_image_folder(str(tmp_path / "images"))
    shards = write_shards(dataset, str(tmp_path / "shards"), quality=95)
    for i, (key, fields) in enumerate(read_all(shards)):
        image, label = dataset[i]
        decoded = Image.open(io.BytesIO(fields["jpg"]))
        assert decoded.format == "JPEG" and decoded.mode == "RGB"
        assert decoded.size == image.size
        # Smooth content at quality 95: close to the original, not equal (JPEG is lossy).
        error = numpy.abs(numpy.asarray(decoded, numpy.int16) - numpy.asarray(image, numpy.int16))
        assert error.mean() < 6, (i, error.mean())
        assert int(fields["cls"]) == label


def test_same_dataset_gives_byte_identical_shards(tmp_path):
    dataset = make_image_folder(str(tmp_path / "images"), classes=2, per_class=3)

    class Mixed(Dataset):
        def __len__(self):
            return len(dataset)

        def __getitem__(self, i):
            image, label = dataset[i]
            return {"jpg": image, "seg.png": image.convert("L"), "cls": label,
                    "features": torch.full((2, 2), float(i)), "meta": {"i": i, "b": [1, 2]},
                    "caption": f"image {i}", "pt": torch.arange(i + 1)}

    first = write_shards(Mixed(), str(tmp_path / "a"), samples_per_shard=4)
    second = write_shards(Mixed(), str(tmp_path / "b"), samples_per_shard=4)
    assert first.digests == second.digests
    for a, b in zip(first.paths + [first.list_file], second.paths + [second.list_file]):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read(), a
    names = tarfile.open(first.paths[0]).getnames()
    # Members sorted within a sample, samples in dataset order.
    assert names[:7] == ["000000000.caption.txt", "000000000.cls", "000000000.features.npy",
                         "000000000.jpg", "000000000.meta.json", "000000000.pt",
                         "000000000.seg.png"]
    fields = read_samples(first.paths[1])[0][1]  # sample 4
    assert json.loads(fields["meta.json"]) == {"i": 4, "b": [1, 2]}
    assert fields["caption.txt"].decode("utf-8") == "image 4"
    assert torch.equal(torch.load(io.BytesIO(fields["pt"])), torch.arange(5))
    assert Image.open(io.BytesIO(fields["seg.png"])).mode == "L"


def test_field_names_follow_value_types(tmp_path):
    samples = [(torch.zeros(2, dtype=torch.int16), torch.ones(3, dtype=torch.float64),
                torch.tensor(7), 2.5, "text", b"\x00\x01", numpy.arange(3, dtype=numpy.uint8),
                [1, 2.5], numpy.int64(4), True)]
    shards = write_shards(samples, str(tmp_path), samples_per_shard=10)
    (key, fields), = read_all(shards)
    assert key == "000000000"
    # Positions whose extension clashes are numbered; unique ones keep the plain extension.
    assert sorted(fields) == ["0.npy", "1.npy", "2.cls", "3.npy", "6.npy", "8.cls", "9.cls",
                              "bin", "json", "txt"]
    assert npy(fields["0.npy"]).dtype == numpy.int16
    numpy.testing.assert_array_equal(npy(fields["1.npy"]), numpy.ones(3))
    assert fields["2.cls"] == b"7" and fields["8.cls"] == b"4" and fields["9.cls"] == b"1"
    scalar = npy(fields["3.npy"])
    assert scalar.shape == () and scalar.dtype == numpy.float64 and scalar == 2.5
    assert fields["txt"] == b"text" and fields["bin"] == b"\x00\x01"
    assert npy(fields["6.npy"]).tolist() == [0, 1, 2]
    assert json.loads(fields["json"]) == [1, 2.5]


def test_fields_argument_names_positions_and_dict_keys(tmp_path):
    x = torch.arange(12, dtype=torch.uint8).reshape(4, 3, 1, 1).expand(4, 3, 2, 2).contiguous()
    shards = write_shards(TensorDataset(x, torch.arange(4), torch.zeros(4)),
                          str(tmp_path / "positional"), fields=["png", "cls", None])
    samples = read_all(shards)
    assert sorted(samples[1][1]) == ["cls", "png"]
    decoded = numpy.asarray(Image.open(io.BytesIO(samples[1][1]["png"])))
    numpy.testing.assert_array_equal(decoded, x[1].permute(1, 2, 0).numpy())  # CHW -> HWC

    class Named(Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"__key__": f"item-{i}", "__url__": "ignored", "x": torch.ones(2) * i,
                    "label": i, "debug": object()}

    shards = write_shards(Named(), str(tmp_path / "named"),
                          fields={"x": "input.npy", "label": "cls", "debug": None})
    samples = read_all(shards)
    assert [k for k, _ in samples] == ["item-0", "item-1", "item-2"]
    assert sorted(samples[2][1]) == ["cls", "input.npy"]
    assert npy(samples[2][1]["input.npy"]).tolist() == [2.0, 2.0]


def test_dict_keys_without_an_extension_get_one(tmp_path):
    dataset = [{"image": Image.new("RGB", (4, 3), (10, 20, 30)), "label": 2}]
    shards = write_shards(dataset, str(tmp_path), image_format="png")
    (key, fields), = read_all(shards)
    assert sorted(fields) == ["image.png", "label.cls"]
    assert Image.open(io.BytesIO(fields["image.png"])).getpixel((0, 0)) == (10, 20, 30)


def test_a_subset_as_a_datamodule_holds_it_is_written_in_its_own_order(tmp_path):
    # What a LightningDataModule's setup() usually makes: random_split's Subsets.
    train, val = torch.utils.data.random_split(TensorDataset(torch.arange(10) * 3), [7, 3],
                                               generator=torch.Generator().manual_seed(1))
    shards = write_shards(train, tmp_path / "train", samples_per_shard=4)  # a Path works too
    assert shards.paths[0] == str(tmp_path / "train" / "shard-000000.tar")
    samples = read_all(shards)
    assert [k for k, _ in samples] == [f"{i:09d}" for i in range(7)]
    assert [int(f["cls"]) for _, f in samples] == [int(train[i][0]) for i in range(7)]


def test_start_and_limit_select_a_range_keyed_by_index(tmp_path):
    shards = write_shards(TensorDataset(torch.arange(30)), str(tmp_path), samples_per_shard=4,
                          start=10, limit=6)
    samples = read_all(shards)
    assert [k for k, _ in samples] == [f"{i:09d}" for i in range(10, 16)]
    assert [int(f["cls"]) for _, f in samples] == list(range(10, 16))
    assert shards.samples == 6 and len(shards.paths) == 2


def test_a_long_key_is_kept_whole(tmp_path):
    key = "k" * 200  # over ustar's 100-character name: tarfile writes a pax header
    shards = write_shards([{"__key__": key, "cls": 1}], str(tmp_path))
    assert read_all(shards) == [(key, {"cls": b"1"})]


class Constant(Dataset):
    def __init__(self, values):
        self.values = values

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        return self.values[i]


@pytest.mark.parametrize("values, kwargs, message", [
    ([1, 2, 3, object()], {}, r"sample 3: a object has no field type"),
    ([(1, None)], {}, r"sample 0: a NoneType has no field type"),
    ([{"__key__": "a.b", "cls": 1}], {}, r"sample 0: __key__ 'a\.b' has a '/' or a '\.'"),
    ([{"__key__": "a/b", "cls": 1}], {}, r"sample 0: __key__ 'a/b' has a '/'"),
    ([{"__key__": "", "cls": 1}], {}, r"sample 0: __key__ '' is not a non-empty str"),
    ([{"__key__": "k" * 201, "cls": 1}], {}, r"sample 0: __key__ is 201 characters"),
    ([{"__key__": "a b", "cls": 1}], {}, r"sample 0: __key__ 'a b' has whitespace"),
    ([{"__key__": "same", "cls": 1}, {"__key__": "same", "cls": 2}], {},
     r"sample 1: key 'same' appears twice in shard-000000\.tar"),
    ([1, "two"], {}, r"sample 1: fields \['txt'\] differ from the first sample's \['cls'\]"),
    ([{"a/b": 1}], {}, r"sample 0: field name 'a/b\.cls' has a '/'"),
    ([{"Image": 1}], {}, r"sample 0: field name 'Image\.cls': each dot-separated part is lower"),
    ([(1, 2)], {"fields": ["cls", ".npy"]}, r"fields=: field name '\.npy' has a '/' or starts"),
    ([(1, 2)], {"fields": ["a/b", "npy"]}, r"fields=: field name 'a/b' has a '/'"),
    ([(1, 2)], {"fields": ["cls"]}, r"sample 0: the sample has 2 values but fields= names 1"),
    ([(1, 2)], {"fields": ["cls", "cls"]}, r"sample 0: fields= names one field twice"),
    ([{"x": 1}], {"fields": {"y": "cls"}}, r"sample 0: key 'x' is not in fields="),
    ([(1,)], {"fields": ["jpg"]}, r"sample 0: field 'jpg': a \.jpg field needs a PIL image"),
    ([("x",)], {"fields": ["cls"]},
     r"sample 0: field 'cls': a \.cls field is an integer class, not a str"),
    ([(1,)], {"fields": ["mp3"]}, r"sample 0: field 'mp3': dtrain does not know extension \.mp3"),
    ([torch.ones(2, dtype=torch.bfloat16)], {},
     r"sample 0: field 'npy': a torch\.bfloat16 tensor has no"),
    ([numpy.ones(2, numpy.uint16)], {},
     r"sample 0: field 'npy': dtype uint16 is not one of bool, uint8"),
    ([numpy.array(["a"])], {}, r"sample 0: field 'npy': dtype <U1 is not one of"),
    ([{"v": float("nan")}], {"fields": {"v": "json"}}, r"sample 0: field 'json': not JSON"),
    ([Image.new("F", (2, 2))], {"image_format": "png"},
     r"sample 0: field 'png': a F image cannot be PNG"),
    ([(b"\x89PNG\r\n\x1a\n...", 1)], {"fields": ["jpg", "cls"]},
     r"sample 0: field 'jpg': bytes given as \.jpg do not start as a JPG file does"),
    ([torch.eye(2).to_sparse()], {},
     r"sample 0: field 'npy': cannot encode a torch\.Tensor: .*Sparse layout"),
    ([1], {"samples_per_shard": 0}, r"samples_per_shard=0: expected an int >= 1"),
    ([1], {"samples_per_shard": 2.5}, r"samples_per_shard=2\.5: expected an int >= 1"),
    ([1], {"quality": 101}, r"quality=101: expected an int 1\.\.100"),
    ([1], {"image_format": "gif"}, r"image_format='gif': expected 'jpg' or 'png'"),
    ([1], {"prefix": "a/b"}, r"prefix='a/b': letters, digits"),
    ([1], {"prefix": "a {b}"}, r"prefix='a \{b\}': letters, digits"),
    ([1], {"start": 2}, r"start=2: expected an int 0\.\.1"),
    ([1, 2], {"start": 1, "limit": 0}, r"nothing to write"),
    ([], {}, r"nothing to write: the dataset has 0 samples"),
])
def test_bad_input_is_refused_with_the_reason(tmp_path, values, kwargs, message):
    with pytest.raises(ValueError, match=message):
        write_shards(Constant(values), str(tmp_path), **kwargs)
    # Nothing half-written is left under a shard's name.
    for path in glob.glob(str(tmp_path / "shard-*.tar")):
        read_samples(path)
    assert not glob.glob(str(tmp_path / ".*.partial"))


def test_an_iterable_dataset_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"a generator is not a map-style dataset"):
        write_shards((i for i in range(3)), str(tmp_path))

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

        def __len__(self):
            return 3

    with pytest.raises(ValueError, match=r"test_write_shards\.Stream is not a map-style dataset"):
        write_shards(Stream(), str(tmp_path))


def test_importing_dtrain_imports_neither_torch_nor_pil():
    # A client-only user (submitting jobs) needs neither; write_shards finds them in sys.modules.
    run = subprocess.run([sys.executable, "-c", "import sys, dtrain; dtrain.data.write_shards; "
                          "print(sorted(m for m in ('torch', 'PIL') if m in sys.modules))"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_existing_shards_are_replaced_only_when_asked(tmp_path):
    write_shards(TensorDataset(torch.arange(10)), str(tmp_path), samples_per_shard=2)
    with pytest.raises(ValueError, match=r"already holds 6 of this prefix's files "
                                         r"\(shard-000000\.tar, \.\.\.\); pass overwrite=True"):
        write_shards(TensorDataset(torch.arange(4)), str(tmp_path), samples_per_shard=2)
    write_shards(TensorDataset(torch.arange(4)), str(tmp_path), prefix="other")  # another prefix
    shards = write_shards(TensorDataset(torch.arange(4)), str(tmp_path), samples_per_shard=2,
                          overwrite=True)
    # The earlier run's shards 2..4 are gone: a directory of shards holds this run's only.
    assert sorted(os.listdir(tmp_path)) == ["other-000000.tar", "other.txt", "shard-000000.tar",
                                            "shard-000001.tar", "shard.txt"]
    assert sum(len(read_samples(p)) for p in shards.paths) == 4


class FailsAt(Dataset):
    def __init__(self, length, failing):
        self.length, self.failing = length, failing

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        if i == self.failing:
            raise OSError(f"cannot read image {i}")
        return torch.full((3,), i), i


def test_a_dataset_that_raises_mid_shard_leaves_no_partial_shard(tmp_path):
    with pytest.raises(OSError, match="cannot read image 15") as raised:
        write_shards(FailsAt(40, 15), str(tmp_path), samples_per_shard=10)
    assert "while write_shards read dataset[15] for shard-000001.tar" in raised.value.__notes__
    # Shard 0 was complete and stays; shard 1 was not and has no file; no list names either.
    assert sorted(os.listdir(tmp_path)) == ["shard-000000.tar"]
    assert [k for k, _ in read_samples(str(tmp_path / "shard-000000.tar"))] == [
        f"{i:09d}" for i in range(10)]


KILLED_WRITER = """
import os, sys, time, torch
from torch.utils.data import Dataset
from dtrain.data import write_shards
class Slow(Dataset):
    def __len__(self): return 40
    def __getitem__(self, i):
        if i == 15:
            open(sys.argv[2], "w").close()  # the parent kills us now, mid-shard
            time.sleep(60)
        return torch.full((1000,), i), i
write_shards(Slow(), sys.argv[1], samples_per_shard=10)
"""


def test_a_writer_killed_mid_shard_leaves_no_shard_under_its_final_name(tmp_path):
    out, marker = tmp_path / "out", tmp_path / "reached"
    process = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(out), str(marker)])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert process.poll() is None, "the writer exited before sample 15"
            assert time.monotonic() < deadline, "the writer never reached sample 15"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    files = sorted(os.listdir(out))
    # The half-written shard is only under its temporary name, which no shard pattern matches.
    assert files == [".shard-000001.tar.partial", "shard-000000.tar"]
    assert len(read_samples(str(out / "shard-000000.tar"))) == 10


def test_progress_prints_a_line_per_shard(tmp_path, capsys):
    write_shards(TensorDataset(torch.arange(5)), str(tmp_path), samples_per_shard=2,
                 progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert lines[2].startswith("write_shards: shard-000002.tar 1 samples")
    assert "(5/5 samples" in lines[2]


def doc_section(title):
    """The python code blocks of one section of docs/data.md, as the reader sees them."""
    with open(os.path.join(REPO, "docs", "data.md")) as f:
        text = f.read()
    section = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_docs_example_runs_as_written(tmp_path, monkeypatch):
    blocks = doc_section("Writing shards from Python")
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for block in blocks:
        exec(compile(block, "docs/data.md", "exec"), namespace)
    with open(tmp_path / "shards" / "train.txt") as f:
        entries = [LIST_LINE.fullmatch(line.strip()) for line in f if not line.startswith("#")]
    assert all(entries) and sum(int(m.group(3)) for m in entries) == 60
    assert namespace["shards"].samples == 60
    # The bytes loader keeps each file's own JPEG, byte for byte.
    dataset = ImageFolder("photos")
    originals = read_all(namespace["originals"])
    assert len(originals) == 60
    for (key, fields), (path, label) in zip(originals, dataset.samples):
        with open(path, "rb") as f:
            assert fields["jpg"] == f.read()
        assert int(fields["cls"]) == label
