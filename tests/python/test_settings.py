"""C++ and Python agree on every job setting. Both read the Setting options of job_spec.proto
(common/job_settings.h; python/dtrain/spec.py): the settings tables they print must be equal, the
same spec files and overrides (every renamed key, every path field relative, absolute and
marked, wrong types) must read to the same JobSpec or the same error, and the C++ normalizer
(dtrain_spec_tool, tests/spec_tool.cc, on the CLI's reader) must apply exactly the defaults,
ranges and names Python reads from the options."""

import json
import os
import subprocess

import pytest
import yaml
from google.protobuf import json_format

from dtrain import spec as dspec
from dtrain.errors import InvalidArgument
from dtrain.v1 import jobs_pb2

BASE = {"model": {"builtin": "mlp"}, "data": {"synthetic": {"train_size": 64}}}


def _tool():
    path = os.environ.get("DTRAIN_SPEC_TOOL")
    if not path or not os.path.exists(path):
        pytest.fail("DTRAIN_SPEC_TOOL is not set to a built dtrain_spec_tool (run through ctest)")
    return path


def cpp(configs=(), overrides=(), cwd=None):
    """What the C++ side makes of config files and (key, YAML text) overrides."""
    args = [_tool()] + [f"--config={c}" for c in configs]
    args += [f"--set={k}={v}" for k, v in overrides]
    run = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=30, check=True)
    out = json.loads(run.stdout)
    for key in ("parsed", "normalized"):
        if out.get(key) is not None:
            out[key] = json_format.ParseDict(out[key], jobs_pb2.JobSpec())
    return out


def python(configs=(), overrides=()):
    """What spec.py makes of the same (one config file, as load_spec takes)."""
    assert len(configs) <= 1
    source = configs[0] if configs else {}
    try:
        values = {k: yaml.safe_load(v) for k, v in overrides}
        return dspec.load_spec(source, overrides=values), None
    except InvalidArgument as e:
        return None, e.message


def write(directory, name, values):
    path = os.path.join(directory, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(values if isinstance(values, str) else yaml.safe_dump(values))
    return path


def tail(message):
    """An error without where it came from ("FILE: ", "--key: ", "override key: ")."""
    return message[message.index(": ") + 2:] if message.startswith(("/", "--", "override ")) \
        else message


def test_both_sides_read_the_same_settings_table():
    table = json.loads(subprocess.run([_tool(), "--table"], capture_output=True, text=True,
                                      check=True, timeout=30).stdout)
    python_table = dspec.settings()
    assert [r["path"] for r in table] == [r["path"] for r in python_table]
    for c, p in zip(table, python_table):
        assert c == p, c["path"]
    # Every leaf has a side: the guard against a half-added setting, seen from Python too.
    assert all(r["side"] in ("COORDINATOR", "WORKERS") for r in python_table)


def test_renamed_keys_are_refused_alike_with_their_hints(tmp_path):
    renamed = {old: hint for r in dspec.settings() for old, hint in r["replaces"].items()}
    assert set(renamed) == {"trainer.num_workers", "trainer.min_workers", "resume_from",
                            "trainer.seed"} | {f"trainer.{k}" for k in LIGHTNING_ONLY}
    for old, hint in renamed.items():
        keys = old.split(".")
        values = dict(BASE)
        node = values
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = 1
        path = write(str(tmp_path), f"{old}.yaml", values)
        c = cpp([path])
        p, error = python([path])
        assert p is None and c["parsed"] is None, old
        assert c["error"] == f"{path}: {old}: {hint}"
        assert error == c["error"]
        # As an override too.
        c = cpp(overrides=[(old, "1")])
        p, error = python(overrides=[(old, "1")])
        assert tail(c["error"]) == tail(error) == f"{old}: {hint}"


def test_every_path_field_resolves_alike_relative_absolute_and_marked(tmp_path):
    paths = [r for r in dspec.settings() if r["path_kind"] != "NOT_A_PATH"]
    assert {r["path"] for r in paths} == {"model.torchscript", "data.tensors_file",
                                          "data.data_dir", "checkpoint.dirpath", "ckpt_path",
                                          "data.shards.train", "data.shards.val",
                                          "data.shards.test", "data.shards.predict",
                                          "data.transforms.script"}
    assert {r["path_kind"] for r in paths if r["path"].startswith("data.shards.")} == {"SHARDS"}
    # Past the plain cases, the spellings os.path.normpath would write differently from the
    # CLI's lexically_normal (a directory's trailing '/', a trailing '..'), a brace pattern, and
    # URLs, which stay as written.
    for value in ("rel/file.pt", "../up.pt", "/abs/file.pt", "worker:/shared/file.pt",
                  "worker:relative.pt", "artifact:sha256:" + "ab" * 32, "job:j1/last.ckpt",
                  "shards/", "a/./b/../c/", "x/..", "./s-{000..009}.tar", "/abs/dir/",
                  "https://h.example/s-{0..9}.tar", "HTTP://h.example/list.txt"):
        for r in paths:
            keys = r["path"].split(".")
            values = json.loads(json.dumps(BASE))
            if r["path"] == "model.torchscript":
                values["model"] = {}
            if r["path"] in ("data.tensors_file",) or r["path"].startswith("data.shards."):
                values["data"] = {}
            node = values
            for k in keys[:-1]:
                node = node.setdefault(k, {})
            node[keys[-1]] = value
            path = write(str(tmp_path), f"specs/{r['path']}.yaml", values)
            c = cpp([path])
            p, error = python([path])
            assert error is None and c["error"] is None, (r["path"], value, error, c["error"])
            assert p == c["parsed"], (r["path"], value)
            # An override resolves against the working directory, on both sides.
            c = cpp([path], [(r["path"], value)], cwd=str(tmp_path))
            cwd = os.getcwd()
            os.chdir(str(tmp_path))
            try:
                p, error = python([path], [(r["path"], value)])
            finally:
                os.chdir(cwd)
            assert p == c["parsed"], (r["path"], value, "override")


def test_keys_and_types_refused_alike(tmp_path):
    cases = [
        "trainer: {max_epoch: 2}", "colour: red", "trainer: {max_epochs: two}",
        "optimizer: {lr: fast}", "data: {shuffle: maybe}", "trainer: 3",
        "trainer: {max_epochs: [1, 2]}", "trainer: {max_epochs:}",
        "model: {builtin: cnn, torchscript: m.pt}", "seed_everything: -1",
    ]
    for i, text in enumerate(cases):
        path = write(str(tmp_path), f"bad-{i}.yaml", text)
        c = cpp([path])
        p, error = python([path])
        assert p is None and c["parsed"] is None, text
        assert tail(error) == tail(c["error"]), text


def _set(values, dotted, value):
    keys = dotted.split(".")
    node = values
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return values


def _typed(row, value):
    return float(value) if row["type"] in ("double", "float") else int(value)


SHARDS_BASE = {"model": {"builtin": "mlp"},
               "data": {"shards": {"train": "worker:/d/t-{0..1}.tar", "fields": [{"name": "npy"}]}}}


def test_repeated_messages_read_alike(tmp_path):
    """data.shards.fields, a list of mappings, from a file and from an override."""
    cases = ["[{name: npy}, {name: cls, type: int}]", "[{name: 'jpg;png', type: image}]",
             "{name: npy}", "[npy]", "", "[{name: npy, colour: red}]", "[{name: [a, b]}]", "[]"]
    for i, fields in enumerate(cases):
        text = ("model: {builtin: mlp}\ndata:\n  shards:\n    train: worker:/d/t.tar\n"
                f"    fields: {fields}\n")
        path = write(str(tmp_path), f"fields-{i}.yaml", text)
        c = cpp([path])
        p, error = python([path])
        assert p == c["parsed"], (fields, error, c["error"])
        if error is not None or c["error"] is not None:
            assert tail(error) == tail(c["error"]), fields
    parsed, error = python([path], [("data.shards.fields", "[{name: npy}, {name: cls}]")])
    c = cpp([path], [("data.shards.fields", "[{name: npy}, {name: cls}]")])
    assert error is None and parsed == c["parsed"]
    assert [f.name for f in parsed.data.shards.fields] == ["npy", "cls"]


def test_cpp_applies_the_defaults_ranges_and_names_python_reads(tmp_path):
    # A list's items have only rules in code (data.shards.fields[i], data.transforms.train[i]);
    # data.shards is in a oneof
    # with data.synthetic, so its settings are checked on a spec of shards.
    rows = [r for r in dspec.settings()
            if not r["in_oneof"] and not r["repeated"] and not r["path"].startswith(
                ("data.normalize.", "data.synthetic.", "data.shards.fields.",
                 "data.transforms."))]
    normalized_of = {}
    for name, values in (("base", BASE), ("shards", SHARDS_BASE)):
        normalized_of[name] = cpp([write(str(tmp_path), f"{name}.yaml", values)])["normalized"]
        assert normalized_of[name] is not None, name
    checked = 0
    for r in rows:
        shards = r["path"].startswith("data.shards.")
        base = SHARDS_BASE if shards else BASE
        message = normalized_of["shards" if shards else "base"]
        for key in r["path"].split(".")[:-1]:
            message = getattr(message, key)
        actual = getattr(message, r["path"].split(".")[-1])
        if r["default"]:
            expected = {"string": str, "bool": lambda t: t == "true"}.get(
                r["type"], lambda t: _typed(r, t))(r["default"])
            assert actual == expected, r["path"]
            checked += 1
        if r["type"] in ("int32", "int64", "uint64", "double") and r["min"] is not None:
            below = r["min"] - 1 if r["min"] - 1 != 0 else -1
            if r["type"] == "uint64":
                continue
            c = cpp([write(str(tmp_path), "low.yaml",
                           _set(json.loads(json.dumps(base)), r["path"], _typed(r, below)))])
            assert c["normalize_code"] == "INVALID_ARGUMENT", r["path"]
            assert c["normalize_error"].startswith(f"{r['path']}: must be "), c["normalize_error"]
            checked += 1
        if r["max"] is not None:
            c = cpp([write(str(tmp_path), "high.yaml",
                           _set(json.loads(json.dumps(base)), r["path"],
                                _typed(r, r["max"] * 2 + 1)))])
            assert c["normalize_error"].startswith(f"{r['path']}: must be "), c["normalize_error"]
            checked += 1
        if r["names"] and r["path"] != "stage":  # the stage is the subcommand's, never a key
            for name in r["names"]:
                c = cpp([write(str(tmp_path), "name.yaml",
                               _set(json.loads(json.dumps(base)), r["path"], name))])
                assert c["normalized"] is not None, (r["path"], name, c.get("normalize_error"))
            c = cpp([write(str(tmp_path), "bad-name.yaml",
                           _set(json.loads(json.dumps(base)), r["path"], "no-such-name"))])
            assert c["normalize_error"].startswith(f"{r['path']}: unknown "), c["normalize_error"]
            checked += 1
    assert checked > 40


# Lightning 2.x's Trainer arguments: those dtrain has, and those it refuses with a hint.
LIGHTNING_SHARED = (
    "accelerator", "strategy", "devices", "num_nodes", "precision", "max_epochs", "min_epochs",
    "max_steps", "min_steps", "limit_val_batches", "val_check_interval",
    "check_val_every_n_epoch", "log_every_n_steps", "accumulate_grad_batches",
    "gradient_clip_val", "gradient_clip_algorithm", "deterministic", "limit_test_batches",
    "limit_predict_batches", "limit_train_batches", "fast_dev_run", "overfit_batches",
    "num_sanity_val_steps")
LIGHTNING_ONLY = (
    "logger", "callbacks", "max_time", "enable_checkpointing", "enable_progress_bar", "enable_model_summary", "benchmark", "inference_mode", "use_distributed_sampler", "profiler", "detect_anomaly",
    "barebones", "plugins", "sync_batchnorm", "reload_dataloaders_every_n_epochs",
    "default_root_dir")


def test_a_lightningcli_trainer_section_works_or_each_key_names_its_equivalent(tmp_path):
    """Every argument of Lightning's Trainer is a dtrain setting or is refused naming what to
    do instead, never 'unknown key'; the shared ones parse as a LightningCLI config has them."""
    trainer = {f.name for f in jobs_pb2.TrainerConfig.DESCRIPTOR.fields}
    assert set(LIGHTNING_SHARED) <= trainer
    assert not set(LIGHTNING_ONLY) & trainer
    pasted = {"accelerator": "cpu", "strategy": "ddp", "devices": 1, "num_nodes": 2,
              "precision": "32-true", "max_epochs": 3, "min_epochs": 1, "max_steps": -1,
              "min_steps": 0, "limit_val_batches": 2, "val_check_interval": 0.5,
              "check_val_every_n_epoch": 1, "log_every_n_steps": 50,
              "accumulate_grad_batches": 1, "gradient_clip_val": 1.0,
              "gradient_clip_algorithm": "norm", "deterministic": True,
              "limit_test_batches": 3, "limit_predict_batches": 2, "limit_train_batches": 1.0,
              "fast_dev_run": False, "overfit_batches": 0.0, "num_sanity_val_steps": 2}
    assert set(pasted) == set(LIGHTNING_SHARED)
    path = write(str(tmp_path), "cli.yaml", dict(BASE, trainer=pasted))
    c = cpp([path])
    p, error = python([path])
    assert error is None and c.get("error") is None, (error, c.get("error"))
    for key in LIGHTNING_ONLY:
        path = write(str(tmp_path), f"{key}.yaml", dict(BASE, trainer={key: True}))
        p, error = python([path])
        assert p is None and error.startswith(f"{path}: trainer.{key}: "), error
        assert "unknown key" not in error, error


def test_lightnings_numbers_and_words_read_alike_on_both_sides(tmp_path):
    """Lightning's int-or-float limits (10 batches, 0.25 of them, 1.0 all) and the words its
    flags take (fast_dev_run: true, devices: auto) mean the same to the CLI and to Python, in a
    file and as overrides."""
    cases = [
        ({"limit_val_batches": 0.25}, "limit_val_fraction", 0.25),
        ({"limit_val_batches": 10}, "limit_val_batches", 10),
        ({"limit_train_batches": 1.0}, "limit_train_fraction", 1.0),
        ({"limit_test_batches": 0}, "limit_test_batches", 0),
        ({"overfit_batches": 0.5}, "overfit_fraction", 0.5),
        ({"fast_dev_run": True}, "fast_dev_run", 1),
        ({"fast_dev_run": 3}, "fast_dev_run", 3),
        ({"devices": "auto"}, "devices", 0),
    ]
    for i, (trainer, field, value) in enumerate(cases):
        path = write(str(tmp_path), f"c{i}.yaml", dict(BASE, trainer=trainer))
        c = cpp([path])
        p, error = python([path])
        assert error is None and c.get("error") is None, (trainer, error, c.get("error"))
        assert p == c["parsed"], trainer
        assert field == "fast_dev_run" or p.trainer.HasField(field), trainer
        assert getattr(p.trainer, field) == value, trainer
        (key, given), = trainer.items()
        text = yaml.safe_dump(given).splitlines()[0]
        c = cpp(overrides=[(f"trainer.{key}", text)])
        p, error = python(overrides=[(f"trainer.{key}", text)])
        assert error is None and c.get("error") is None, (trainer, error, c.get("error"))
        assert getattr(p.trainer, field) == value and p == c["parsed"], trainer
    # Lightning's whole floats count batches (10.0 is ten), and YAML's other truths are words.
    for text, field, value in [("limit_val_batches: 10.0", "limit_val_batches", 10),
                               ("fast_dev_run: yes", "fast_dev_run", 1),
                               ("fast_dev_run: off", "fast_dev_run", 0)]:
        path = write(str(tmp_path), "text.yaml",
                     yaml.safe_dump(BASE) + "trainer: {" + text + "}\n")
        c = cpp([path])
        p, error = python([path])
        assert error is None and c.get("error") is None, (text, error, c.get("error"))
        assert p == c["parsed"] and getattr(p.trainer, field) == value, text
    # A flag's count and share are one key: the later spelling wins, in a file or an override,
    # where a oneof's other members are refused.
    path = write(str(tmp_path), "both.yaml",
                 dict(BASE, trainer={"limit_val_batches": 2, "limit_val_fraction": 0.5}))
    c = cpp([path])
    p, error = python([path])
    assert error is None and p == c["parsed"], (error, c.get("error"))
    assert p.trainer.WhichOneof("limit_val") == "limit_val_fraction"
    path = write(str(tmp_path), "share.yaml", dict(BASE, trainer={"limit_val_batches": 0.25}))
    c = cpp([path], overrides=[("trainer.limit_val_batches", "10")])
    assert c.get("error") is None, c.get("error")
    assert c["parsed"].trainer.limit_val_batches == 10
    p = dspec.load_spec(path, overrides={"trainer.limit_val_batches": 10})
    assert p == c["parsed"]
