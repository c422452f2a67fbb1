"""The Python Client against a real local cluster: a job submitted, watched and read from
Python, and the errors a user meets, each as its DtrainError subclass."""

import os
import time

import grpc
import numpy as np
import pytest
import yaml

import dtrain
from dtrain.v1 import jobs_pb2


def synthetic_spec(name, epochs=1):
    return {
        "name": name,
        "model": {"builtin": "mlp"},
        "data": {"synthetic": {"train_size": 1024, "val_size": 256, "test_size": 256, "seed": 3},
                 "batch_size": 32},
        "trainer": {"max_epochs": epochs, "strategy": "ddp", "num_nodes": 2},
        "seed_everything": 1,
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "checkpoint": {"monitor": "val_acc"},
    }


def wait_for_idle_workers(client, n, seconds=30):
    deadline = time.monotonic() + seconds
    while len([w for w in client.workers() if not w.job_id and not w.assigned_job_id]) < n:
        assert time.monotonic() < deadline, "the workers were not let go"
        time.sleep(0.1)


def test_submit_watch_and_read_a_job(cluster, tmp_path):
    client = dtrain.Client(cluster.address)
    job = client.submit(synthetic_spec("py", epochs=3), overrides={"trainer.max_epochs": 2})
    assert job.id == "py-1"
    updates = list(job.watch(timeout=300))
    assert len(updates) >= 2, "progress updates, then the end"
    assert all(u.id == "py-1" for u in updates)
    assert dtrain.is_terminal(updates[-1]) and not any(dtrain.is_terminal(u) for u in updates[:-1])
    final = job.wait(timeout=60)
    assert final.state == jobs_pb2.SUCCEEDED
    # The override won over the dict's 3 epochs: 2 epochs of 1024 / (32 x 2 ranks) steps.
    assert final.progress.max_epochs == 2
    assert final.progress.global_step == 32

    results = job.results()
    assert results["state"] == "SUCCEEDED"
    assert results["metrics"]["test_acc"] > 0.8
    assert results["checkpoint"] == "job:py-1/last.ckpt"
    # The checkpoints came to the coordinator: downloaded, verified, and read by torch.
    names = sorted(f["name"] for f in results["files"])
    assert names == ["epoch=0-step=16.ckpt", "last.ckpt"], names
    [last] = job.download("last", str(tmp_path / "ckpts"))
    assert last == str(tmp_path / "ckpts" / "last.ckpt")
    import torch
    assert torch.load(last)["global_step"] == 32
    assert [os.path.basename(p) for p in job.download("all", str(tmp_path / "all"))] == \
        [f.name for f in job.files()]
    with pytest.raises(dtrain.NotFound, match="it keeps"):
        job.download("nosuch.ckpt", str(tmp_path))
    rows = job.metrics()
    names = {r["name"] for r in rows}
    assert {"train_loss", "val_loss", "val_acc", "test_acc"} <= names
    train = [r for r in rows if r["name"] == "train_loss"]
    assert [r["step"] for r in train] == sorted(r["step"] for r in train)
    assert all(isinstance(r["value"], float) and r["wall_unix_ms"] > 0 for r in rows)
    lines = list(job.logs())
    assert any("test: test_acc=" in line for line in lines)
    assert list(job.logs(follow=True)) == lines, "follow ends at a finished job's last line"

    assert "py-1" in [s.id for s in client.list()]
    workers = client.workers()
    assert sorted(w.name for w in workers) == ["w0", "w1"]
    assert client.get("py-1").status().state == jobs_pb2.SUCCEEDED

    # A YAML file, with a relative data path resolved against its directory, as the CLI does.
    spec = synthetic_spec("fromfile")
    spec["trainer"]["num_nodes"] = 1
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    status = client.submit(str(path), stage="validate").wait(timeout=300)
    assert "val_acc" in status.metrics and "train_loss" not in status.metrics

    wait_for_idle_workers(client, 2)
    report = client.dry_run(synthetic_spec("dry"))
    assert report.worker in ("w0", "w1")
    assert "loss" in report.training_step_keys
    assert "py-1" in [s.id for s in client.list()] and "dry-1" not in [s.id for s in client.list()]


def test_cancel_and_job_failed(cluster):
    client = dtrain.Client(cluster.address)
    spec = synthetic_spec("long", epochs=1000)
    spec["data"]["synthetic"]["train_size"] = 8192
    job = client.submit(spec)
    deadline = time.monotonic() + 180
    while job.status().state != jobs_pb2.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(dtrain.FailedPrecondition, match="cancel it first"):
        client.delete(job.id)
    job.cancel()
    with pytest.raises(dtrain.JobFailed) as failed:
        job.wait(timeout=120)
    assert failed.value.status.state == jobs_pb2.CANCELLED
    assert failed.value.code == grpc.StatusCode.CANCELLED
    assert "long-1 CANCELLED" in failed.value.message
    assert client.delete(job.id).id == "long-1"
    with pytest.raises(dtrain.NotFound):
        job.status()

    broken = synthetic_spec("broken")
    broken["model"] = {"torchscript": "worker:/nonexistent/model.pt"}
    with pytest.raises(dtrain.JobFailed) as failed:
        client.submit(broken).wait(timeout=180)
    assert failed.value.status.state == jobs_pb2.FAILED
    assert "/nonexistent/model.pt" in failed.value.message
    assert "worker 'w" in failed.value.message


def test_errors_are_dtrain_errors_with_code_and_message(cluster, tmp_path):
    client = dtrain.Client(cluster.address)
    with pytest.raises(dtrain.InvalidArgument) as bad:
        client.submit({"trainer": {"max_epoch": 2}})
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "trainer.max_epoch: unknown key; trainer has max_epochs" in bad.value.message
    with pytest.raises(dtrain.InvalidArgument, match="renamed to trainer.num_nodes"):
        client.submit({"trainer": {"num_workers": 2}})
    with pytest.raises(dtrain.InvalidArgument, match="chosen by the call"):
        client.submit({"stage": "test"})
    with pytest.raises(dtrain.InvalidArgument, match="override trainer.max_epochs: "
                                                     "trainer.max_epochs: expected an integer"):
        client.submit(synthetic_spec("x"), overrides={"trainer.max_epochs": "two"})
    # The coordinator's own checks (the spec's values) come back the same way.
    spec = synthetic_spec("neg")
    spec["early_stopping"] = {"monitor": "val_loss", "patience": -2}
    with pytest.raises(dtrain.InvalidArgument, match="early_stopping.patience"):
        client.submit(spec)
    unsent = synthetic_spec("unsent")
    unsent["model"] = {"torchscript": "/nonexistent/model.pt"}
    with pytest.raises(dtrain.InvalidArgument, match="model.torchscript: '/nonexistent/model.pt' "
                                                     "is not a file here.*worker:/nonexistent"):
        client.submit(unsent)
    with pytest.raises(dtrain.NotFound) as missing:
        client.get("nope-1")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(dtrain.NotFound, match="does not exist"):
        client.submit(str(tmp_path / "none.yaml"))
    with pytest.raises(dtrain.DeadlineExceeded):
        job = client.submit(dict(synthetic_spec("slow", epochs=1000), data={
            "synthetic": {"train_size": 8192, "val_size": 256, "test_size": 256},
            "batch_size": 32}))
        try:
            job.wait(timeout=1.0)
        finally:
            job.cancel()
    with pytest.raises(dtrain.Unavailable, match="cannot reach 127.0.0.1:1"):
        dtrain.Client("127.0.0.1:1", timeout=2).list()
    with pytest.raises(dtrain.DtrainError):  # the base class catches them all
        client.get("nope-2")


def test_token_required(tmp_path):
    from conftest import Cluster

    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-for-tests\n")
    c = Cluster(str(tmp_path), workers=0, coordinator_flags=[f"--token_file={token_file}"])
    try:
        with pytest.raises(dtrain.Unauthenticated) as refused:
            dtrain.Client(c.address, token="").list()
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert dtrain.Client(c.address, token="s3cret-token-for-tests").list() == []
    finally:
        c.stop()


def test_mutual_tls(tmp_path):
    """A coordinator requiring mutual TLS: the Client and a ProcessGroup connect with
    dtrain.TLS(ca, cert, key) (or DTRAIN_TLS_*); without a client certificate they are refused."""
    import subprocess

    from conftest import Cluster

    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    certs = tmp_path / "certs"
    subprocess.run(["bash", os.path.join(source, "deploy/tls/make-test-certs.sh"), str(certs)],
                   check=True, capture_output=True)
    c = Cluster(str(tmp_path), workers=0, coordinator_flags=[
        f"--tls_cert={certs}/server.pem", f"--tls_key={certs}/server.key",
        f"--tls_ca={certs}/ca.pem", "--tls_require_client_cert"])
    try:
        tls = dtrain.TLS(ca=f"{certs}/ca.pem", cert=f"{certs}/client.pem", key=f"{certs}/client.key")
        assert dtrain.Client(c.address, tls=tls).list() == []
        with dtrain.ProcessGroup("tls-group", 1, c.address, tls=tls) as pg:
            assert pg.all_reduce(np.arange(3, dtype=np.int64)).tolist() == [0, 1, 2]
        with pytest.raises(dtrain.Unavailable):
            dtrain.Client(c.address, tls=dtrain.TLS(ca=f"{certs}/ca.pem"), timeout=5).list()
        with pytest.raises(dtrain.InvalidArgument, match="tls ca"):
            dtrain.Client(c.address, tls=dtrain.TLS(ca=str(tmp_path / "missing.pem")))
    finally:
        c.stop()


def test_spec_paths_resolve_where_they_were_written(tmp_path, monkeypatch):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "job.yaml").write_text(
        "model: {torchscript: ../models/m.pt}\ndata: {tensors_file: data.pt}\n")
    spec = dtrain.load_spec(str(tmp_path / "jobs" / "job.yaml"), "fit",
                            {"ckpt_path": "runs/last.ckpt"})
    monkeypatch.chdir(tmp_path)
    assert spec.model.torchscript == str(tmp_path / "models" / "m.pt")
    assert spec.data.tensors_file == str(tmp_path / "jobs" / "data.pt")
    from_dict = dtrain.load_spec({"model": {"torchscript": "m.pt"}, "ckpt_path": "/abs/x.ckpt"})
    assert from_dict.model.torchscript == str(tmp_path / "m.pt")
    assert from_dict.ckpt_path == "/abs/x.ckpt"
    message = jobs_pb2.JobSpec()
    message.model.torchscript = "relative.pt"
    assert dtrain.load_spec(message, "test").model.torchscript == "relative.pt"
    assert dtrain.load_spec(message, "test").stage == "test"
