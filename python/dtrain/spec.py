"""Job specs from Python: a dict, a YAML or JSON file, or a JobSpec message, read with the same
rules as the dtrain command line (client/job_spec_file.cc): keys map onto JobSpec's fields, an
unknown key or a wrong type is refused naming its path, Lightning's spellings only (the old keys
name the new ones), relative paths in a file resolve against the file's directory, and the stage
is chosen by the call (Lightning's subcommand), never by a ``stage`` key.

Which keys were renamed and which fields are paths are not written here: they are the Setting
option on each field of JobSpec (proto/dtrain/v1/job_spec.proto), read through the descriptors
as the C++ side reads them (common/job_settings.h). ``settings()`` lists them all; the
coordinator applies their defaults and ranges when the job is submitted."""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import grpc
import yaml
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from dtrain.errors import InvalidArgument, NotFound
from dtrain.v1 import jobs_pb2, setting_pb2

SpecLike = Union[Mapping[str, Any], str, os.PathLike, jobs_pb2.JobSpec]
STAGES = ("fit", "validate", "test", "predict")

_MARKS = ("worker:", "artifact:", "job:")  # common/file_reference.h
_CPP_TYPES = {
    FieldDescriptor.CPPTYPE_INT32: "int32", FieldDescriptor.CPPTYPE_INT64: "int64",
    FieldDescriptor.CPPTYPE_UINT32: "uint32", FieldDescriptor.CPPTYPE_UINT64: "uint64",
    FieldDescriptor.CPPTYPE_DOUBLE: "double", FieldDescriptor.CPPTYPE_FLOAT: "float",
    FieldDescriptor.CPPTYPE_BOOL: "bool", FieldDescriptor.CPPTYPE_ENUM: "enum",
    FieldDescriptor.CPPTYPE_STRING: "string", FieldDescriptor.CPPTYPE_MESSAGE: "message",
}


def _option(field: FieldDescriptor) -> setting_pb2.Setting:
    return field.GetOptions().Extensions[setting_pb2.setting]


def _is_map(field: FieldDescriptor) -> bool:
    return (field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE
            and field.message_type.GetOptions().map_entry)


def _in_oneof(field: FieldDescriptor) -> bool:
    # proto3 `optional` fields are oneofs of one
    return field.containing_oneof is not None and len(field.containing_oneof.fields) > 1


def _leaves(descriptor, prefix: str = "") -> Iterator[Tuple[str, FieldDescriptor]]:
    for field in descriptor.fields:
        path = f"{prefix}.{field.name}" if prefix else field.name
        if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE and not _is_map(field):
            yield from _leaves(field.message_type, path)
        else:
            yield path, field


def settings() -> List[Dict[str, Any]]:
    """Every job setting, as its field's Setting option states it: one dict per leaf field under
    JobSpec, in declaration order (path, type, side, default, min, max, zero_means, names,
    plugin_kind, path_kind, replaces, unit). The same table as the C++ side's
    (tests/python/test_settings.py checks it)."""
    table = []
    for path, field in _leaves(jobs_pb2.JobSpec.DESCRIPTOR):
        o = _option(field)
        table.append({
            "path": path,
            "type": _CPP_TYPES[field.cpp_type],
            "repeated": field.label == FieldDescriptor.LABEL_REPEATED,
            "in_oneof": _in_oneof(field),
            "side": setting_pb2.Setting.Side.Name(o.side),
            "default": o.default_value,
            "min": o.min if o.HasField("min") else None,
            "max": o.max if o.HasField("max") else None,
            "zero_means": o.zero_means,
            "names": list(o.names),
            "plugin_kind": o.plugin_kind,
            "path_kind": setting_pb2.Setting.PathKind.Name(o.path),
            "replaces": {r.key: r.hint for r in o.replaces},
            "unit": o.unit,
        })
    return table


def _replaced_keys() -> Dict[str, str]:
    return {r.key: r.hint for _, field in _leaves(jobs_pb2.JobSpec.DESCRIPTOR)
            for r in _option(field).replaces}


_RENAMED = _replaced_keys()


def path_fields(spec: Message, prefix: str = "") -> Iterator[Tuple[str, int, Message, str]]:
    """(path, Setting.PathKind, message, field name) of each field of ``spec`` that holds a path
    (its Setting option says so; a oneof's member only when chosen), in declaration order."""
    for field in spec.DESCRIPTOR.fields:
        if _in_oneof(field) and spec.WhichOneof(field.containing_oneof.name) != field.name:
            continue
        path = f"{prefix}.{field.name}" if prefix else field.name
        if field.label == FieldDescriptor.LABEL_REPEATED:
            continue
        if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            if spec.HasField(field.name):
                yield from path_fields(getattr(spec, field.name), path)
            continue
        kind = _option(field).path
        if kind != setting_pb2.Setting.NOT_A_PATH and getattr(spec, field.name):
            yield path, kind, spec, field.name


def _bad(path: str, message: str) -> InvalidArgument:
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, f"{path}: {message}")


def _scalar(field: FieldDescriptor, value: Any, path: str) -> Any:
    if isinstance(value, (dict, list)):
        raise _bad(path, "expected a single value")
    if value is None:
        raise _bad(path, "has no value")
    t = field.cpp_type
    if t == FieldDescriptor.CPPTYPE_STRING:
        # YAML reads `precision: 32` as a number; the field wants its text.
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)
    if t == FieldDescriptor.CPPTYPE_BOOL:
        if not isinstance(value, bool):
            raise _bad(path, f"expected true or false, got '{value}'")
        return value
    if t in (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64,
             FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64):
        if isinstance(value, bool) or not isinstance(value, int):
            what = "a non-negative integer" if t in (FieldDescriptor.CPPTYPE_UINT32,
                                                      FieldDescriptor.CPPTYPE_UINT64) else "an integer"
            raise _bad(path, f"expected {what}, got '{value}'")
        if value < 0 and t in (FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64):
            raise _bad(path, f"expected a non-negative integer, got '{value}'")
        return value
    if t in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(path, f"expected a number, got '{value}'")
        return float(value)
    if t == FieldDescriptor.CPPTYPE_ENUM:
        # As the CLI: torchvision's spelling ("bilinear", "edge") or the enum's own name.
        enum = field.enum_type
        prefix = field.name.upper() + "_"
        text = str(value)
        for name in (text, (prefix + text).upper()):
            if name in enum.values_by_name:
                return enum.values_by_name[name].number
        names = [v.name[len(prefix):].lower() if v.name.startswith(prefix) else v.name
                 for v in enum.values]
        raise _bad(path, f"unknown value '{text}'; use {', '.join(names)}")
    raise _bad(path, "this field cannot be set from a file")


def _lightning_value(message: Message, field: FieldDescriptor,
                     value: Any) -> Tuple[FieldDescriptor, Any]:
    """As the CLI: Lightning's flags that take words (fast_dev_run: true, devices: auto) or
    either kind of number (limit_val_batches: 10 or 0.25), by the Setting's words and
    fraction_field: the field to set and the value it reads."""
    o = _option(field)
    if isinstance(value, (str, bool)):
        text = str(value).lower()
        for w in o.words:
            if text == w.word:
                numeric = field.cpp_type in (FieldDescriptor.CPPTYPE_INT32,
                                             FieldDescriptor.CPPTYPE_INT64)
                return field, int(w.value) if numeric else w.value
    if o.fraction_field and isinstance(value, float):
        # Lightning's _determine_batch_limits: 10.0 is ten batches; 0.25 or 1.0 a share.
        if value > 1 and value.is_integer() and value < 9e18:
            return field, int(value)
        fraction = message.DESCRIPTOR.fields_by_name.get(o.fraction_field)
        if fraction is not None:
            return fraction, value
    return field, value


def _fill(message: Message, values: Any, path: str) -> None:
    if values is None:
        return
    if not isinstance(values, Mapping):
        raise _bad(path or "spec", "expected a mapping of keys to values")
    descriptor = message.DESCRIPTOR
    for key, value in values.items():
        key = str(key)
        where = f"{path}.{key}" if path else key
        field = descriptor.fields_by_name.get(key)
        if field is None:
            field = next((f for f in descriptor.fields if f.camelcase_name == key), None)
        if field is None:
            if where in _RENAMED:
                raise _bad(where, _RENAMED[where])
            known = ", ".join(f.name for f in descriptor.fields)
            raise _bad(where, f"unknown key; {path or 'a job spec'} has {known}")
        oneof = field.containing_oneof  # proto3 `optional` fields are oneofs of one
        if oneof is not None and len(oneof.fields) > 1:
            current = message.WhichOneof(oneof.name)
            # A Lightning flag's count and fraction are one key, whichever spelling comes later.
            pair = current is not None and (
                _option(field).fraction_field == current
                or _option(descriptor.fields_by_name[current]).fraction_field == field.name)
            if current is not None and current != field.name and not pair:
                raise _bad(path, f"give only one of {current} and {field.name}")
        if field.label == FieldDescriptor.LABEL_REPEATED:
            # As the CLI: a list, or one value for a list of one; a list of mappings for a
            # message (`fields: [{name: npy}, {name: cls, type: int}]`).
            is_message = field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE
            if value is None and not is_message:
                raise _bad(where, "has no value")
            if value is None or isinstance(value, Mapping):
                raise _bad(where, "expected a list")
            items = value if isinstance(value, list) else [value]
            container = getattr(message, field.name)
            del container[:]
            for i, item in enumerate(items):
                if is_message:
                    if not isinstance(item, Mapping):
                        raise _bad(f"{where}[{i}]", "expected a mapping")
                    _fill(container.add(), item, f"{where}[{i}]")
                else:
                    container.append(_scalar(field, item, f"{where}[{i}]"))
        elif field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            sub = getattr(message, field.name)
            sub.SetInParent()
            _fill(sub, value, where)
        else:
            field, value = _lightning_value(message, field, value)
            setattr(message, field.name, _scalar(field, value, where))


def lexically_normal(path: str) -> str:
    """``path`` as C++'s std::filesystem::path::lexically_normal writes it on POSIX, which the
    CLI applies to a relative path joined to its base: "." and "dir/.." removed, separators
    collapsed, and, unlike os.path.normpath, a trailing separator kept ("shards/" stays a
    directory's spelling). The CLI and Python must spell a resolved path alike: an uploaded
    shard list's first line names it, and that line is part of the list's digest."""
    if not path:
        return path
    absolute = path.startswith("/")
    parts = path.split("/")
    out: List[str] = []
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if out and out[-1] != "..":
                out.pop()
            elif not absolute:
                out.append("..")
            continue
        out.append(part)
    # A path ending in a separator, ".", or a ".." that removed a name keeps a separator.
    trailing = parts[-1] in ("", ".", "..")
    text = ("/" if absolute else "") + "/".join(out)
    if not out:
        return "/" if absolute else "."
    return text + "/" if trailing and out[-1] != ".." else text


def is_http_url(s: str) -> bool:
    """An http:// or https:// URL, the scheme in any case (common/file_reference.h)."""
    return s[:7].lower() == "http://" or s[:8].lower() == "https://"


def _resolve(spec: jobs_pb2.JobSpec, base: str) -> None:
    # As the CLI (client/job_spec_file.cc): absolute paths, marked ones and URLs as written.
    for _, _, message, name in list(path_fields(spec)):
        p = getattr(message, name)
        if not os.path.isabs(p) and not p.startswith(_MARKS) and not is_http_url(p):
            setattr(message, name, lexically_normal(f"{base}/{p}"))


def _nested(dotted: str, value: Any) -> Dict[str, Any]:
    keys = dotted.split(".")
    if any(not k for k in keys):
        raise _bad(dotted, "an override is section.key")
    out: Dict[str, Any] = {keys[-1]: value}
    for key in reversed(keys[:-1]):
        out = {key: out}
    return out


def load_spec(spec: SpecLike, stage: Optional[str] = None,
              overrides: Optional[Mapping[str, Any]] = None) -> jobs_pb2.JobSpec:
    """The JobSpec for ``spec`` (a dict, a YAML/JSON path, or a JobSpec), with ``overrides``
    (dotted keys, as the CLI's ``--trainer.max_epochs=5``) applied and ``stage`` set. Relative
    paths become absolute: a file's against its directory, a dict's and an override's against
    the working directory (the workers do not share it); a JobSpec's are left as they are.

    Raises InvalidArgument naming the key's path, or NotFound for a missing file."""
    if stage is not None and stage not in STAGES:
        raise _bad("stage", f"unknown stage '{stage}'; use {', '.join(STAGES)}")
    if isinstance(spec, jobs_pb2.JobSpec):
        out = jobs_pb2.JobSpec()
        out.CopyFrom(spec)
    elif isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise NotFound(grpc.StatusCode.NOT_FOUND, f"config file '{path}' does not exist") from None
        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise _bad(path, f"syntax error: {e}") from None
        out = jobs_pb2.JobSpec()
        try:
            _fill(out, values, "")
        except InvalidArgument as e:
            raise InvalidArgument(e.code, f"{path}: {e.message}") from None
        if out.stage:
            raise _bad("stage", f"'{out.stage}' is chosen by the call (stage=), as LightningCLI's "
                                "subcommand; remove the key")
        _resolve(out, os.path.dirname(os.path.abspath(path)))
    elif isinstance(spec, Mapping):
        out = jobs_pb2.JobSpec()
        _fill(out, spec, "")
        if out.stage:
            raise _bad("stage", f"'{out.stage}' is chosen by the call (stage=), as LightningCLI's "
                                "subcommand; remove the key")
        # The workers do not share this process's working directory.
        _resolve(out, os.getcwd())
    else:
        raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                              f"spec: give a dict, a YAML/JSON path or a JobSpec, not {type(spec).__name__}")
    for key, value in (overrides or {}).items():
        try:
            _fill(out, _nested(key, value), "")
        except InvalidArgument as e:
            raise InvalidArgument(e.code, f"override {key}: {e.message}") from None
    if overrides:
        _resolve(out, os.getcwd())  # an override's relative path, as the CLI's, from here
    if stage is not None:
        out.stage = stage
    return out
