"""write_shards(): any map-style dataset (len + indexing: a torchvision ImageFolder, a
LightningDataModule's train_dataset, a TensorDataset) to WebDataset tar shards and the list file
a job's data.shards names (docs/data.md). Written with Python's tarfile; the same dataset gives
byte-identical shards, so their sha256 digests are stable.

    import dtrain
    shards = dtrain.data.write_shards(ImageFolder("photos/"), "shards/", samples_per_shard=1000)
    print(shards.list_file, shards.pattern)     # shards/shard.txt shard-{000000..000012}.tar

torch and PIL are imported by the caller, never here: a value is only a tensor or an image when
the caller's dataset made one. Memory is bounded by one sample's encoded fields: shards are
streamed to disk and each is hashed as it is written.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import io
import json
import math
import os
import re
import sys
import tarfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy

# What a field's last extension means, and what a value of each type becomes by default.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png")
# numpy dtypes a .npy field may hold: the ones dtrain's reader turns into tensors.
NPY_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
# Modes PNG stores as they are; anything else would change the pixels.
PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "I;16")
MAX_KEY_CHARS = 200
MAX_SHARDS = 1_000_000  # shard numbers have six digits, so lexical order is numeric order
_FIELD_PART = re.compile(r"[a-z0-9_-]+")
_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

FieldsArg = Union[None, Sequence[Optional[str]], Mapping[str, Optional[str]]]


@dataclasses.dataclass(frozen=True)
class ShardSet:
    """What write_shards wrote: the shards (in order), the list file naming them with their
    digests and sample counts, the number of samples, and the shards' names in brace notation
    (relative to the output directory, e.g. "shard-{000000..000009}.tar")."""
    paths: List[str]
    list_file: str
    samples: int
    pattern: str
    digests: List[str]  # "sha256:<hex>" per shard, as in the list file


class _HashingWriter:
    """A file that hashes what tarfile writes to it, so a shard is digested as it is made."""

    def __init__(self, file):
        self._file = file
        self._hash = hashlib.sha256()
        self._position = 0

    def write(self, data) -> int:
        self._file.write(data)
        self._hash.update(data)
        self._position += len(data)
        return len(data)

    def tell(self) -> int:
        return self._position

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _torch():
    return sys.modules.get("torch")


def _is_tensor(value) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def _is_image(value) -> bool:
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(value, pil.Image)


def _is_integer(value) -> bool:
    """A class label: a Python int or bool, a numpy integer, or a 0-dim integer tensor."""
    if isinstance(value, (int, numpy.integer, numpy.bool_)):
        return True
    if _is_tensor(value):
        return value.dim() == 0 and not value.dtype.is_floating_point \
            and not value.dtype.is_complex and value.dtype != _torch().bool
    return False


def _default_extension(value, image_format: str) -> str:
    if _is_image(value):
        return image_format
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bin"
    if isinstance(value, str):
        return "txt"
    if _is_integer(value):
        return "cls"
    if isinstance(value, (float, numpy.floating, numpy.ndarray)) or _is_tensor(value):
        return "npy"
    if isinstance(value, (dict, list)):
        return "json"
    raise _Refused(f"a {_type_name(value)} has no field type; give bytes, str, int, float, a "
                   "tensor, a numpy array, a PIL image, or a dict/list for JSON")


class _Refused(Exception):
    """A value or name write_shards cannot write; becomes a ValueError naming the sample."""


def _type_name(value) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def _check_field_name(name) -> None:
    if not isinstance(name, str) or not name:
        raise _Refused(f"field name {name!r} is not a non-empty str")
    if "/" in name or name.startswith("."):
        raise _Refused(f"field name {name!r} has a '/' or starts with '.'; a member's name is "
                       "<key>.<field>, so the field must be extensions such as 'jpg' or 'seg.png'")
    for part in name.split("."):
        if not _FIELD_PART.fullmatch(part):
            raise _Refused(f"field name {name!r}: each dot-separated part is lowercase letters, "
                           "digits, '_' or '-' (WebDataset readers lowercase extensions)")


def _check_key(key) -> str:
    if not isinstance(key, str) or not key:
        raise _Refused(f"__key__ {key!r} is not a non-empty str")
    if "/" in key or "." in key:
        raise _Refused(f"__key__ {key!r} has a '/' or a '.'; readers split a member's name at "
                       "the first '.' into key and field")
    if len(key) > MAX_KEY_CHARS:
        raise _Refused(f"__key__ is {len(key)} characters; at most {MAX_KEY_CHARS}")
    if any(ord(c) < 32 or ord(c) == 127 or c.isspace() for c in key):
        raise _Refused(f"__key__ {key!r} has whitespace or a control character")
    return key


def _npy(value) -> bytes:
    if _is_tensor(value):
        torch = _torch()
        if value.dtype in (torch.bfloat16,) or value.dtype.is_complex:
            raise _Refused(f"a {value.dtype} tensor has no .npy dtype dtrain reads; convert it "
                           f"(.float()) first")
        value = value.detach().cpu().numpy()
    elif isinstance(value, (bool, int, float, numpy.generic)):
        value = numpy.asarray(value)
    elif not isinstance(value, numpy.ndarray):
        raise _Refused(f"a {_type_name(value)} cannot be .npy; give a tensor or a numpy array")
    if value.dtype.name not in NPY_DTYPES:
        raise _Refused(f"dtype {value.dtype} is not one of {', '.join(NPY_DTYPES)}")
    # Little-endian and C order, whatever the array was: the reader expects no other.
    value = numpy.asarray(value, dtype=value.dtype.newbyteorder("<"), order="C")
    out = io.BytesIO()
    numpy.save(out, value, allow_pickle=False)
    return out.getvalue()


def _image_from_array(value):
    """A uint8 tensor (CHW or HW, torchvision's layout) or numpy array (HWC or HW, PIL's) as a
    PIL image, so tensors of pixels can be written as .png/.jpg."""
    from PIL import Image  # only reached for an image field, which needs PIL anyway
    if _is_tensor(value):
        if value.dim() == 3:
            value = value.permute(1, 2, 0)
        value = value.detach().cpu().numpy()
    if value.dtype != numpy.uint8 or value.ndim not in (2, 3) or \
            (value.ndim == 3 and value.shape[2] not in (1, 3, 4)):
        raise _Refused(f"an image array must be uint8 of shape HW, or CHW (tensor) / HWC (numpy) "
                       f"with 1, 3 or 4 channels; got {value.dtype} {tuple(value.shape)}")
    if value.ndim == 3 and value.shape[2] == 1:
        value = value[:, :, 0]
    return Image.fromarray(numpy.ascontiguousarray(value))


def _image(value, extension: str, quality: int) -> bytes:
    if not _is_image(value):
        if isinstance(value, numpy.ndarray) or _is_tensor(value):
            value = _image_from_array(value)
        else:
            raise _Refused(f"a .{extension} field needs a PIL image or a uint8 array, "
                           f"not a {_type_name(value)}")
    out = io.BytesIO()
    if extension == "png":
        if value.mode not in PNG_MODES:
            raise _Refused(f"a {value.mode} image cannot be PNG without changing its pixels; "
                           f"convert it first (e.g. image.convert('RGB'))")
        value.save(out, format="PNG")
    else:
        if value.mode != "RGB":
            value = value.convert("RGB")
        value.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _json(value) -> bytes:
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False,
                          ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise _Refused(f"not JSON (numbers, str, bool, None, lists and dicts with str keys): {e}")
    return text.encode("utf-8")


# The first bytes of an encoded image, so that bytes given as one are checked to be one.
_MAGIC = {"jpg": (b"\xff\xd8\xff",), "jpeg": (b"\xff\xd8\xff",), "png": (b"\x89PNG\r\n\x1a\n",)}


def _encode_field(value, field: str, quality: int) -> bytes:
    try:
        return _encode(value, field, quality)
    except _Refused as e:
        raise _Refused(f"field {field!r}: {e}") from None
    except (TypeError, ValueError, RuntimeError, OSError) as e:  # numpy, torch or PIL refusing
        raise _Refused(f"field {field!r}: cannot encode a {_type_name(value)}: {e}") from e


def _encode(value, field: str, quality: int) -> bytes:
    """The bytes of one field; the last extension says how (WebDataset's meanings)."""
    extension = field.rsplit(".", 1)[-1]
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value)  # already encoded: written as it is, under any extension
        if extension in _MAGIC and not value.startswith(_MAGIC[extension]):
            raise _Refused(f"bytes given as .{extension} do not start as a {extension.upper()} "
                           f"file does ({value[:8]!r}); is it another format?")
        return value
    if extension in IMAGE_EXTENSIONS:
        return _image(value, extension, quality)
    if extension == "cls":
        if not _is_integer(value):
            raise _Refused(f"a .cls field is an integer class, not a {_type_name(value)}")
        return str(int(value)).encode("ascii")
    if extension == "npy":
        return _npy(value)
    if extension == "txt":
        if not isinstance(value, str):
            raise _Refused(f"a .txt field is a str, not a {_type_name(value)}")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _Refused(f"text is not encodable as UTF-8: {e}")
    if extension == "json":
        return _json(value)
    if extension in ("pt", "pth"):
        if not _is_tensor(value):
            raise _Refused(f"a .{extension} field is a tensor, not a {_type_name(value)}")
        out = io.BytesIO()
        _torch().save(value.detach().cpu().clone(), out)
        return out.getvalue()
    raise _Refused(f"dtrain does not know extension .{extension}; use jpg, png, cls, npy, txt, "
                   "json, pt, or give the value as bytes to write it as it is")


def _is_metadata(name: str) -> bool:
    # WebDataset's own sample keys (__key__, __url__, __local_path__) are not fields.
    return name.startswith("__") and name.endswith("__")


def _fields_of(sample, fields: FieldsArg, image_format: str) -> Tuple[Optional[str],
                                                                       Dict[str, Any]]:
    """The sample's own key (or None) and its values by field name."""
    if isinstance(sample, Mapping):
        key = _check_key(sample["__key__"]) if "__key__" in sample else None
        named: Dict[str, Any] = {}
        if fields is not None and not isinstance(fields, Mapping):
            raise _Refused("the sample is a dict, so fields= is a dict of its keys to extensions")
        for name, value in sample.items():
            if not isinstance(name, str):
                raise _Refused(f"dict key {name!r} is not a str")
            if _is_metadata(name):
                continue
            if fields is not None:
                if name not in fields:
                    raise _Refused(f"key {name!r} is not in fields= (map it to None to leave "
                                   "it out)")
                field = fields[name]
                if field is None:
                    continue
            elif _is_known_field(name):
                field = name  # already a WebDataset field name ("jpg", "seg.png")
            else:
                field = f"{name}.{_default_extension(value, image_format)}"
            if field in named:
                raise _Refused(f"two of the sample's keys would both be field {field!r}")
            named[field] = value
        if fields is not None:
            missing = [k for k, v in fields.items() if v is not None and k not in sample]
            if missing:
                raise _Refused(f"fields= names {missing} that the sample does not have")
        return key, _unique(named)
    values = list(sample) if isinstance(sample, (tuple, list)) else [sample]
    if fields is not None:
        if isinstance(fields, Mapping) or isinstance(fields, str):
            raise _Refused("the sample is positional, so fields= is a list of extensions, one "
                           "per position (None leaves one out)")
        if len(fields) != len(values):
            raise _Refused(f"the sample has {len(values)} values but fields= names {len(fields)}")
        return None, _unique({f: v for f, v in zip(fields, values) if f is not None},
                             expected=sum(f is not None for f in fields))
    extensions = [_default_extension(v, image_format) for v in values]
    names = [e if extensions.count(e) == 1 else f"{i}.{e}" for i, e in enumerate(extensions)]
    return None, dict(zip(names, values))


def _is_known_field(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS + ("cls", "npy", "txt", "json", "bin",
                                                          "pt", "pth")


def _unique(named: Dict[str, Any], expected: Optional[int] = None) -> Dict[str, Any]:
    if expected is not None and len(named) != expected:
        raise _Refused("fields= names one field twice")
    for name in named:
        _check_field_name(name)
    return named


def _check_int(name: str, value, lowest: int, highest: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, numpy.integer)) or value < lowest \
            or (highest is not None and value > highest):
        bound = f"{lowest}..{highest}" if highest is not None else f">= {lowest}"
        raise ValueError(f"{name}={value!r}: expected an int {bound}")
    return int(value)


def _pattern(names: List[str], prefix: str) -> str:
    if len(names) == 1:
        return names[0]
    return f"{prefix}-{{{0:06d}..{len(names) - 1:06d}}}.tar"


def _existing_outputs(out_dir: str, prefix: str) -> List[str]:
    escaped = glob.escape(os.path.join(out_dir, prefix))
    shards = [p for p in glob.glob(f"{escaped}-*.tar")
              if re.fullmatch(r"\d{6}", p[len(os.path.join(out_dir, prefix)) + 1:-4])]
    listed = os.path.join(out_dir, f"{prefix}.txt")
    return sorted(shards) + ([listed] if os.path.exists(listed) else [])


def _replace_atomically(temporary: str, final: str, file) -> None:
    file.flush()
    os.fsync(file.fileno())
    file.close()
    os.replace(temporary, final)


def write_shards(dataset, out_dir: str, samples_per_shard: int = 1000, prefix: str = "shard",
                 image_format: str = "jpg", quality: int = 95, fields: FieldsArg = None,
                 start: int = 0, limit: Optional[int] = None, progress: bool = False,
                 overwrite: bool = False) -> ShardSet:
    """Writes dataset[start : start + limit] as WebDataset shards <prefix>-000000.tar, ... in
    out_dir, and the list file <out_dir>/<prefix>.txt (`<shard> sha256:<hex> samples:<n>`).

    A sample's key is its index, f"{index:09d}", or a dict sample's own "__key__". Its fields:
    a tuple or list by position, a dict by name, any other value is one field. By default a
    field's extension follows its value: a PIL image -> image_format ("jpg" at `quality`, or
    lossless "png"); an int, numpy integer or 0-dim integer tensor -> "cls"; a tensor, numpy
    array or float -> "npy"; str -> "txt"; bytes -> "bin"; a dict or list -> "json". A tuple's
    positions whose extensions clash are numbered ("0.npy", "1.npy"); a dict's key becomes
    "<key>.<extension>" unless it is a field name already ("jpg", "seg.png"). `fields` names
    them instead: a list with one extension per position, or a dict of dict keys to extensions
    (None leaves a value out). A dict's "__url__"-style keys (WebDataset's metadata) are not
    fields. Every sample must have the fields the first one had.

    Output is deterministic (mtime 0, owner 0, mode 0644, members sorted within a sample), and
    each shard is written under a temporary name and renamed when complete. An out_dir that
    already holds <prefix>-NNNNNN.tar or <prefix>.txt is refused unless overwrite=True, which
    deletes them first (a stale shard would otherwise join a directory of shards).

    Raises ValueError, naming the sample index, for a value it cannot encode, a bad field name
    or key, or samples with different fields; ValueError for a bad argument; and whatever the
    dataset raises (with a note naming the index). `progress` prints a line per shard to stderr.
    """
    torch = _torch()
    iterable = torch is not None and isinstance(dataset, torch.utils.data.IterableDataset)
    if iterable or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError(f"a {_type_name(dataset)} is not a map-style dataset: write_shards "
                         "needs len(dataset) and dataset[i]")
    samples_per_shard = _check_int("samples_per_shard", samples_per_shard, 1)
    quality = _check_int("quality", quality, 1, 100)
    length = len(dataset)
    start = _check_int("start", start, 0, length)
    count = length - start if limit is None else min(_check_int("limit", limit, 0), length - start)
    if count < 1:
        raise ValueError(f"nothing to write: the dataset has {length} samples, start={start}, "
                         f"limit={limit}")
    if image_format not in ("jpg", "png"):
        raise ValueError(f"image_format={image_format!r}: expected 'jpg' or 'png'")
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix) or len(prefix) > 200:
        raise ValueError(f"prefix={prefix!r}: letters, digits, '_', '-' and '.' (not first), so "
                         "that shard names need no quoting in a list file or brace pattern")
    shard_count = math.ceil(count / samples_per_shard)
    if shard_count > MAX_SHARDS:
        raise ValueError(f"{count} samples at {samples_per_shard} per shard make {shard_count} "
                         f"shards; at most {MAX_SHARDS}: raise samples_per_shard")
    if fields is not None:
        named = fields.values() if isinstance(fields, Mapping) else fields
        if isinstance(fields, str):
            raise ValueError("fields= is a list of extensions or a dict, not a str")
        for name in named:
            if name is not None:
                try:
                    _check_field_name(name)
                except _Refused as e:
                    raise ValueError(f"fields=: {e}") from None

    os.makedirs(out_dir, exist_ok=True)
    existing = _existing_outputs(out_dir, prefix)
    if existing:
        if not overwrite:
            raise ValueError(f"{out_dir} already holds {len(existing)} of this prefix's files "
                             f"({os.path.basename(existing[0])}, ...); pass overwrite=True to "
                             "replace them, or another prefix or directory")
        for path in existing:
            os.remove(path)

    first_fields: Optional[List[str]] = None
    paths: List[str] = []
    digests: List[str] = []
    counts: List[int] = []
    began = time.monotonic()
    for shard in range(shard_count):
        name = f"{prefix}-{shard:06d}.tar"
        final = os.path.join(out_dir, name)
        temporary = os.path.join(out_dir, f".{name}.partial")
        first = start + shard * samples_per_shard
        indices = range(first, min(first + samples_per_shard, start + count))
        file = open(temporary, "wb")
        try:
            writer = _HashingWriter(file)
            keys = set()
            with tarfile.open(fileobj=writer, mode="w", format=tarfile.PAX_FORMAT,
                              encoding="utf-8") as tar:
                for index in indices:
                    try:
                        sample = dataset[index]
                    except Exception as e:
                        if hasattr(e, "add_note"):
                            e.add_note(f"while write_shards read dataset[{index}] for {name}")
                        raise
                    try:
                        key, named = _fields_of(sample, fields, image_format)
                        key = key if key is not None else f"{index:09d}"
                        if key in keys:
                            raise _Refused(f"key {key!r} appears twice in {name}; readers would "
                                           "merge the two samples")
                        keys.add(key)
                        if first_fields is None:
                            first_fields = sorted(named)
                        elif sorted(named) != first_fields:
                            raise _Refused(f"fields {sorted(named)} differ from the first "
                                           f"sample's {first_fields}; pass fields= to name them")
                        encoded = [(f, _encode_field(named[f], f, quality)) for f in sorted(named)]
                    except _Refused as e:
                        raise ValueError(f"sample {index}: {e}") from e.__cause__
                    for field, data in encoded:
                        info = tarfile.TarInfo(f"{key}.{field}")
                        info.size = len(data)
                        info.mtime = 0
                        info.mode = 0o644
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        info.type = tarfile.REGTYPE
                        tar.addfile(info, io.BytesIO(data))
            _replace_atomically(temporary, final, file)
        except BaseException:
            file.close()
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        paths.append(final)
        digests.append(f"sha256:{writer.hexdigest()}")
        counts.append(len(indices))
        if progress:
            done = sum(counts)
            rate = done / max(time.monotonic() - began, 1e-9)
            print(f"write_shards: {name} {len(indices)} samples, {writer.tell() / 1e6:.1f} MB "
                  f"({done}/{count} samples, {rate:.0f} samples/s)", file=sys.stderr, flush=True)

    names = [os.path.basename(p) for p in paths]
    pattern = _pattern(names, prefix)
    list_file = os.path.join(out_dir, f"{prefix}.txt")
    lines = [f"# written by dtrain.data.write_shards: {count} samples in {len(names)} shards, "
             f"{pattern}"]
    lines += [f"{n} {d} samples:{c}" for n, d, c in zip(names, digests, counts)]
    temporary = os.path.join(out_dir, f".{prefix}.txt.partial")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, list_file)
    return ShardSet(paths=paths, list_file=list_file, samples=count, pattern=pattern,
                    digests=digests)
