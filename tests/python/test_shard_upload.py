"""A job on the client's own shards, submitted from Python against a real local cluster (a
coordinator and two workers on 127.0.0.1): dtrain.data.write_shards writes them, Client.submit
uploads them shard by shard (dtrain.shard_upload) and names them by an uploaded list, two ranks
train from them, and a second submit sends none again. The CLI (build/client/dtrain) uploads
the same shards to the same list artifact, byte for byte: the list's digest is compared."""

import gzip
import io
import os
import re
import subprocess
import tarfile

import pytest
import torch
import yaml
from torch.utils.data import TensorDataset

import dtrain
from dtrain.artifacts import digest_of, fetch
from dtrain.errors import DataLoss, InvalidArgument, NotFound
from dtrain.shard_upload import upload_shards
from dtrain.tar_samples import count_tar_samples
from dtrain.v1 import jobs_pb2

SUMMARY = re.compile(r"^(data\.shards\.\w+): (\d+) shards, (\d+) samples \(([0-9.]+) MB\), "
                     r"(\d+) sent, the list as (artifact:(sha256:[0-9a-f]{64}))$")
FIELDS = [{"name": "npy"}, {"name": "cls", "type": "int"}]


def learnable(n, seed):
    """Ten classes of [1, 28, 28] float images: class c brightens rows 2c..2c+2, plus noise (the
    C++ e2e test's data); int64 labels."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.randn(n, 1, 28, 28, generator=g) * 0.3
    for i in range(n):
        x[i, 0, 2 * y[i]:2 * y[i] + 3, :] += 1.0
    return TensorDataset(x, y)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    train = dtrain.data.write_shards(learnable(800, 1), str(root / "train"),
                                     samples_per_shard=100)
    val = dtrain.data.write_shards(learnable(200, 2), str(root / "val"), samples_per_shard=100)
    return root, train, val


def job_spec(name, train, val, **shards):
    return {
        "name": name,
        "model": {"builtin": "mlp"},
        "data": {"shards": {"train": train, "val": val, "fields": FIELDS, "shuffle_buffer": 64,
                            **shards},
                 "batch_size": 32, "num_workers": 2},
        "trainer": {"max_epochs": 2, "strategy": "ddp", "num_nodes": 2},
        "seed_everything": 5,
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
    }


def summaries(lines):
    out = {}
    for line in lines:
        m = SUMMARY.match(line)
        assert m, line
        out[m.group(1)] = {"shards": int(m.group(2)), "samples": int(m.group(3)),
                           "mb": float(m.group(4)), "sent": int(m.group(5)),
                           "reference": m.group(6), "digest": m.group(7), "line": line}
    return out


def expected_list(field, value, paths, counts):
    return f"# {field}: {value}, uploaded by dtrain\n" + "".join(
        f"artifact:{digest_of(p)} {digest_of(p)} samples:{n}\n" for p, n in zip(paths, counts))


def test_local_shards_train_on_two_workers_and_are_sent_once(cluster, shards, tmp_path,
                                                            monkeypatch):
    root, train, val = shards
    client = dtrain.Client(cluster.address)
    train_dir, val_dir = os.path.dirname(train.paths[0]), os.path.dirname(val.paths[0])
    spec = job_spec("pyshards", train_dir, val_dir)

    first = client.submit(spec)
    sent = summaries(client.uploaded)
    assert set(sent) == {"data.shards.train", "data.shards.val"}, client.uploaded
    t, v = sent["data.shards.train"], sent["data.shards.val"]
    assert (t["shards"], t["samples"], t["sent"]) == (8, 800, 8), t["line"]
    assert (v["shards"], v["samples"], v["sent"]) == (2, 200, 2), v["line"]
    size = sum(os.path.getsize(p) for p in train.paths)
    assert t["line"].endswith(f"({size / 1e6:.1f} MB), 8 sent, the list as {t['reference']}")
    # The spec the coordinator holds names the lists, not this machine's paths.
    held = first.status().spec.data.shards
    assert (held.train, held.val) == (t["reference"], v["reference"])

    final = first.wait(timeout=300)
    assert final.state == jobs_pb2.SUCCEEDED
    assert final.metrics["val_acc"] > 0.8, dict(final.metrics)
    assert any("800 training samples" in line for line in first.logs()), list(first.logs())

    # The uploaded list, byte for byte: its header names the split and where it came from,
    # then one line per shard in the directory's order, with the counts write_shards wrote.
    listed = fetch(client._conn, t["digest"], str(tmp_path / "train-list.txt"))
    with open(listed) as f:
        text = f.read()
    assert text == expected_list("data.shards.train", train_dir, train.paths, [100] * 8)

    # Again: every shard is stored already, so none is sent and the list is the same one; the
    # same seed and shards give the same model.
    second = client.submit(job_spec("pyshards-again", train_dir, val_dir))
    again = summaries(client.uploaded)
    assert again["data.shards.train"]["sent"] == 0 and again["data.shards.val"]["sent"] == 0
    assert again["data.shards.train"]["reference"] == t["reference"]
    assert again["data.shards.val"]["reference"] == v["reference"]
    final2 = second.wait(timeout=300)
    assert final2.metrics["val_loss"] == final.metrics["val_loss"]

    # A dry run reads the first batch from the shards as the job would. It needs an idle worker:
    # a job's SUCCEEDED is published once its workers are free, so it runs at once.
    report = client.dry_run(spec)
    assert summaries(client.uploaded)["data.shards.train"]["sent"] == 0
    assert report.batch == "tuple(float32[32, 1, 28, 28], int64[32])", report
    assert {s.name: (s.size, s.streamed) for s in report.splits} == {
        "train": (800, True), "val": (200, True)}, report

    # Uploaded ahead, from a relative path: the same list; a spec naming it hashes nothing.
    monkeypatch.chdir(str(root))
    ahead = client.upload_shards("train")
    assert (ahead.reference, ahead.shards, ahead.samples, ahead.sent) == \
        (t["reference"], 8, 800, 0)
    assert ahead.summary("data.shards.train") == again["data.shards.train"]["line"]
    client.dry_run(job_spec("ahead", ahead.reference, val_dir))
    assert [line.split(":")[0] for line in client.uploaded] == ["data.shards.val"]
    client.close()


def _cli(cluster, *args):
    binary = os.environ.get("DTRAIN_CLI_BIN")
    if not binary or not os.path.exists(binary):
        pytest.fail("DTRAIN_CLI_BIN is not set to a built dtrain (run the tests through ctest)")
    return subprocess.run([binary, *args, f"--coordinator={cluster.address}", "--timeout=30s"],
                          capture_output=True, text=True, timeout=120)


def test_the_cli_uploads_the_same_lists(cluster, shards, tmp_path):
    """The same spec through the CLI and through Python: a pattern, a directory and a list file
    with relative, worker and URL entries. Both print the same lines and name the same list
    artifacts, so their list files are byte-identical."""
    root, train, val = shards
    train_dir, val_dir = os.path.dirname(train.paths[0]), os.path.dirname(val.paths[0])
    # A list file of one's own: a relative shard with its digest, a counted one, and entries
    # the workers read themselves (never read here; a URL nobody serves).
    mixed = tmp_path / "lists" / "mixed.txt"
    os.makedirs(mixed.parent)
    rel = os.path.relpath(val.paths[1], mixed.parent)
    # Shards the two tar readers could count differently (libarchive on the CLI's side, tarfile
    # here): links, a directory, a FIFO, names without a field, a key seen again; as .tar.gz too.
    odd = tmp_path / "lists" / "odd.tar"
    with tarfile.open(str(odd), "w", format=tarfile.GNU_FORMAT) as tar:
        for name, kind in (("a.cls", tarfile.REGTYPE), ("a.npy", tarfile.REGTYPE),
                           ("b.cls", tarfile.LNKTYPE), ("c.cls", tarfile.SYMTYPE),
                           ("d", tarfile.DIRTYPE), ("e.x", tarfile.AREGTYPE),
                           ("f.x", tarfile.CONTTYPE), ("g.x", tarfile.FIFOTYPE),
                           ("h/.hidden", tarfile.REGTYPE), ("i.", tarfile.REGTYPE),
                           ("noext", tarfile.REGTYPE), ("a.json", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "a.cls" if kind in (tarfile.LNKTYPE, tarfile.SYMTYPE) else ""
            regular = kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
            info.size = 2 if regular else 0
            tar.addfile(info, io.BytesIO(b"{}") if regular else None)
    odd_gz = tmp_path / "lists" / "odd.tar.gz"
    odd_gz.write_bytes(gzip.compress(odd.read_bytes()))
    mixed.write_text(f"# mine\n{rel} {digest_of(val.paths[1])}\n\n{val.paths[0]} samples:100\n"
                     f"worker:/nowhere/w-{{0..1}}.tar\n"
                     f"https://127.0.0.1:9/u.tar samples:7 {'sha256:' + 'c' * 64}\n"
                     "odd.tar\nodd.tar.gz\n")
    spec = job_spec("pyshards-cli", f"{train_dir}/shard-{{000000..000007}}.tar", val_dir + "/",
                    predict=str(mixed))
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(spec))

    cli = _cli(cluster, "fit", "--config", str(config), "--dry_run")
    cli_lines = [line for line in cli.stdout.splitlines() if line.startswith("data.shards.")]
    assert len(cli_lines) == 3, (cli.returncode, cli.stdout, cli.stderr)
    client = dtrain.Client(cluster.address)
    try:
        client.dry_run(spec)
    except dtrain.DtrainError:
        pass  # what the dry run finds is not this test's; the uploads before it are
    python_lines = client.uploaded
    c, p = summaries(cli_lines), summaries(python_lines)
    assert set(c) == set(p) == {"data.shards.train", "data.shards.val", "data.shards.predict"}
    for field in c:
        # The CLI went first, so Python sends nothing; everything else is the same.
        assert p[field]["sent"] == 0, p[field]["line"]
        assert {k: x for k, x in p[field].items() if k not in ("sent", "line")} == \
            {k: x for k, x in c[field].items() if k not in ("sent", "line")}, (c[field], p[field])
    # 4 samples in each odd shard (a, e, f, a again), counted alike on both sides.
    assert (p["data.shards.predict"]["shards"], p["data.shards.predict"]["samples"]) == (7, 215)
    text = open(fetch(client._conn, p["data.shards.predict"]["digest"],
                      str(tmp_path / "mixed-list.txt"))).read()
    v1, v0 = digest_of(val.paths[1]), digest_of(val.paths[0])
    assert text == (f"# data.shards.predict: {mixed}, uploaded by dtrain\n"
                    f"artifact:{v1} {v1} samples:100\n"
                    f"artifact:{v0} {v0} samples:100\n"
                    "worker:/nowhere/w-0.tar\nworker:/nowhere/w-1.tar\n"
                    f"https://127.0.0.1:9/u.tar {'sha256:' + 'c' * 64} samples:7\n"
                    f"artifact:{digest_of(str(odd))} {digest_of(str(odd))} samples:4\n"
                    f"artifact:{digest_of(str(odd_gz))} {digest_of(str(odd_gz))} samples:4\n")
    # The directory's spelling with its trailing '/' is the CLI's too (the list's first line).
    text = open(fetch(client._conn, p["data.shards.val"]["digest"],
                      str(tmp_path / "val-list.txt"))).read()
    assert text.startswith(f"# data.shards.val: {val_dir}/, uploaded by dtrain\n")
    client.close()


def test_bad_local_shards_are_refused_naming_the_split(cluster, shards, tmp_path):
    root, train, val = shards
    client = dtrain.Client(cluster.address)
    conn = client._conn
    with pytest.raises(NotFound) as e:
        upload_shards(conn, str(tmp_path / "nothing-here"), "data.shards.train")
    assert e.value.message == (f"data.shards.train: '{tmp_path}/nothing-here' is neither tar "
                               "shards (*.tar), a directory nor a list file here; if it is on "
                               f"every worker, write worker:{tmp_path}/nothing-here")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".hidden.tar").write_bytes(b"")
    with pytest.raises(NotFound) as e:
        upload_shards(conn, str(tmp_path / "empty"), "data.shards.val")
    assert "data.shards.val: directory" in e.value.message and "holds no tar shards" in \
        e.value.message
    with pytest.raises(NotFound) as e:
        upload_shards(conn, f"{tmp_path}/missing-{{0..1}}.tar", "data.shards.train")
    assert e.value.message == f"data.shards.train: shard '{tmp_path}/missing-0.tar' is not a " \
        "file here"
    with pytest.raises(InvalidArgument) as e:
        upload_shards(conn, f"{tmp_path}/bad-{{0..1.tar", "data.shards.train")
    assert e.value.message.startswith("data.shards.train: shard pattern ")
    listed = tmp_path / "wrong.txt"
    listed.write_text(f"{train.paths[0]} sha256:{'0' * 64}\n")
    with pytest.raises(DataLoss) as e:
        upload_shards(conn, str(listed), "data.shards.train")
    assert e.value.message == (f"data.shards.train: shard '{train.paths[0]}' has digest "
                               f"{digest_of(train.paths[0])}, its list says sha256:{'0' * 64}")
    listed.write_text("a.tar samples:x\n")
    with pytest.raises(InvalidArgument) as e:
        upload_shards(conn, str(listed), "data.shards.train")
    assert e.value.message == (f"data.shards.train: list file '{listed}': shard list, line 1: a "
                               "sample count is samples: and a whole number below 10^12")
    (tmp_path / "cut.tar").write_bytes(open(train.paths[0], "rb").read()[:5000])
    with pytest.raises(DataLoss) as e:
        upload_shards(conn, str(tmp_path / "cut.tar"), "data.shards.train")
    assert e.value.message.startswith(f"data.shards.train: shard '{tmp_path}/cut.tar' after ")
    # Through submit, the same refusal, and nothing is queued.
    before = len(client.list())
    with pytest.raises(NotFound):
        client.submit(job_spec("refused", str(tmp_path / "empty"), str(tmp_path / "empty")))
    assert len(client.list()) == before
    assert count_tar_samples(train.paths[0]) == 100
    client.close()
