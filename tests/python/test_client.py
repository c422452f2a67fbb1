"""The Python Client against a real local cluster: a job submitted, watched and read from
Python, and the errors a user meets, each as its DtrainError subclass."""

import hashlib
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
    loaded = torch.load(last)
    assert loaded["global_step"] == 32
    assert loaded["lr_schedulers"] == [], "no schedule, none in the checkpoint"
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


def test_checkpoint_lr_schedulers_are_lightnings_and_torch_goes_on_from_them(cluster, tmp_path):
    """docs/checkpoints.md: lr_schedulers holds [scheduler.state_dict()] of StepLR or
    CosineAnnealingLR as Lightning saves it, the scheduler stepped after each optimizer step
    (last_epoch = the global step), with the optimizer's param group at the rate that schedule
    gives next. Loaded as the docs show (optimizer, then scheduler), torch goes on with the rates
    of an uninterrupted torch run."""
    import torch

    client = dtrain.Client(cluster.address)
    schedules = {"cosine": {"name": "cosine"},
                 "step": {"name": "step", "step_size": 5, "gamma": 0.5}}
    jobs = {}
    for name, schedule in schedules.items():
        spec = synthetic_spec(f"sched-{name}")
        # One worker each, so both run at once: 1024 samples in batches of 32, 32 steps (the
        # cosine's length); validated, so checkpointed, at steps 16 and 32.
        spec["trainer"].update(num_nodes=1, val_check_interval=0.5)
        spec["lr_scheduler"] = schedule
        spec["checkpoint"] = {"monitor": "val_acc", "save_top_k": 2}
        jobs[name] = client.submit(spec)
    for name, job in jobs.items():
        assert job.wait(timeout=300).state == jobs_pb2.SUCCEEDED, name

    def torch_run(name, params, steps):
        """The job's optimizer and schedule in torch, stepped as Lightning steps them."""
        optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
        scheduler = (torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=32)
                     if name == "cosine" else
                     torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5))
        for _ in range(steps):
            optimizer.step()
            scheduler.step()
        return optimizer, scheduler

    for name, job in jobs.items():
        for which, step in (("epoch=0-step=16.ckpt", 16), ("last", 32)):
            [path] = job.download(which, str(tmp_path / name))
            ckpt = torch.load(path)
            assert ckpt["global_step"] == step
            [saved] = ckpt["lr_schedulers"]
            expected_optimizer, expected = torch_run(name, [torch.zeros(1, requires_grad=True)],
                                                     step)
            want = expected.state_dict()
            assert sorted(saved) == sorted(want), (name, step)
            for key, value in want.items():
                if key == "_last_lr":  # torch recurses from the last rate; dtrain computes it
                    assert saved[key] == pytest.approx(value, rel=1e-12, abs=1e-15), (name, key)
                elif isinstance(value, (bool, int)) and key != "eta_min":  # counts and flags
                    assert saved[key] == value and type(saved[key]) is type(value), (name, key)
                else:  # rates (torch keeps eta_min as given, here the int 0)
                    assert saved[key] == value, (name, key)
            [group] = ckpt["optimizer_states"][0]["param_groups"]
            [want_group] = expected_optimizer.state_dict()["param_groups"]
            for key in ("lr", "initial_lr"):
                assert group[key] == pytest.approx(want_group[key], rel=1e-12, abs=1e-15), \
                    (name, step, key)
            # Loaded as the docs show into the same classes over the model's parameters, torch
            # goes on with an uninterrupted run's rates.
            params = [torch.zeros_like(t, requires_grad=True) for t in ckpt["state_dict"].values()]
            optimizer, resumed = torch_run(name, params, 0)
            optimizer.load_state_dict(ckpt["optimizer_states"][0])
            resumed.load_state_dict(saved)
            _, reference = torch_run(name, [torch.zeros(1, requires_grad=True)], step + 3)
            for _ in range(3):
                optimizer.step()
                resumed.step()
            assert resumed.last_epoch == step + 3
            assert resumed.get_last_lr() == pytest.approx(reference.get_last_lr(), rel=1e-9,
                                                           abs=1e-12), (name, step)


def test_download_refuses_bytes_that_do_not_hash_and_fetches_again(cluster, tmp_path):
    """Job.download keeps a file only when its bytes hash to its digest: damaged once on the way
    (a proxy flips one of its bytes), it is fetched again and arrives intact; damaged in the
    coordinator's store, three attempts are refused and DataLoss is raised, nothing kept."""
    from corrupting_proxy import CorruptingProxy

    client = dtrain.Client(cluster.address)
    job = client.submit(synthetic_spec("hashed"))
    assert job.wait(timeout=300).state == jobs_pb2.SUCCEEDED
    [last] = [f for f in job.files() if f.name == "last.ckpt"]
    hex_digest = last.digest[len("sha256:"):]
    stored = os.path.join(cluster.dir, "state", "artifacts", "objects", hex_digest[:2],
                          hex_digest[2:])
    with open(stored, "rb") as f:
        data = f.read()
    # Four pieces of the file, each found once in it: the first to pass is damaged (one might
    # straddle two HTTP/2 frames, not all four).
    pieces = [data[len(data) * k // 5:][:32] for k in range(1, 5)]
    assert all(data.count(p) == 1 for p in pieces)

    proxy = CorruptingProxy(cluster.address, pieces, times=1)
    try:
        through = dtrain.Client(proxy.address)
        [path] = through.get(job.id).download("last", str(tmp_path / "once"))
        assert proxy.corrupted == 1, "the proxy damaged nothing"
        with open(path, "rb") as f:
            assert "sha256:" + hashlib.sha256(f.read()).hexdigest() == last.digest
        assert os.listdir(tmp_path / "once") == ["last.ckpt"]
        through.close()
    finally:
        proxy.close()

    middle = len(data) // 2
    with open(stored, "r+b") as f:
        f.seek(middle)
        f.write(bytes([data[middle] ^ 0xFF]))
    with pytest.raises(dtrain.DataLoss, match=r"hash to sha256:[0-9a-f]{64}; nothing was kept "
                                              r"\(attempt 3 of 3\)"):
        job.download("last", str(tmp_path / "never"))
    assert os.listdir(tmp_path / "never") == []


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
