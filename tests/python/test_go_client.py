"""A Go client (tests/go_client, grpc-go with stubs generated from proto/ at build time) against a
real local cluster: health, server reflection as grpcurl uses it, paged listings through a
default 4 MiB receive limit, a process group's collectives and their errors, and a job
submitted, watched and read back (its TensorBoard file framed as TensorBoard reads it), whose
checkpoint Python's torch then loads; and the same client over mutual TLS with a token."""

import json
import os
import subprocess

import pytest
import torch


def go_client():
    path = os.environ.get("DTRAIN_GO_CLIENT")
    if not path or not os.path.exists(path):
        pytest.fail("DTRAIN_GO_CLIENT is not set to the built Go client: run through ctest, "
                    "with Go and its protoc plugins installed (deploy/install-deps.sh --test) "
                    "before cmake configures")
    return path


SPEC = {
    "name": "go",
    "model": {"builtin": "mlp"},
    "data": {"synthetic": {"train_size": 1024, "val_size": 256, "test_size": 256, "seed": 3},
             "batch_size": 32},
    "trainer": {"max_epochs": 2, "strategy": "ddp", "num_nodes": 2},
    "seed_everything": 1,
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
}


def test_a_go_client_uses_the_whole_public_api(cluster, tmp_path):
    checkpoint = tmp_path / "last.ckpt"
    run = subprocess.run(
        [go_client(), f"--address={cluster.address}", f"--spec={json.dumps(SPEC)}",
         f"--checkpoint_out={checkpoint}"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, f"the Go client failed:\n{run.stderr}"
    report = json.loads(run.stdout)

    assert report["health"] == "SERVING"
    assert {"dtrain.v1.Coordinator", "dtrain.v1.Jobs", "dtrain.v1.Workers", "dtrain.v1.Artifacts",
            "grpc.health.v1.Health"} <= set(report["services"]), report["services"]
    # Each service's file and everything it imports, job_spec.proto's descriptor.proto included.
    assert {"dtrain/v1/jobs.proto", "dtrain/v1/job_spec.proto", "dtrain/v1/setting.proto",
            "google/protobuf/descriptor.proto"} <= set(report["reflected_files"])
    # Reflection v1, which grpcurl asks for first, lists and resolves the same.
    assert "grpc.reflection.v1.ServerReflection" in report["services"]
    assert report["services_v1"] == report["services"]
    assert report["reflected_files_v1"] == report["reflected_files"]
    assert json.loads(report["dynamic_list_jobs"]) == {}, "no job yet, and ListJobs said so"

    assert report["workers"] == ["w0", "w1"] and report["worker_pages"] == 2
    assert "page_size" in report["negative_page_size"]

    assert report["members"] == ["0:go0", "1:go1"]
    # Rank r sent [r+1, 2(r+1), 0.5, -r]; both ranks hold the same sum.
    assert report["all_reduce"] == [[3.0, 6.0, 1.0, -1.0]] * 2
    assert report["any"] == [True, True] and report["all"] == [False, False]
    assert all("rank 0" in m and "rank 1" in m for m in report["mismatch"]), report["mismatch"]
    assert report["short_payload"], "the refusal says why"

    # Rank 0 gathers [[0, 1]], rank 1 [[100, 101], [102, 103]]: uneven parts, in rank order.
    assert report["all_gather"] == ["[[1 2] [2 2]] [0 1 100 101 102 103]"] * 2
    assert report["broadcast"] == ["from rank 1, in Go"] * 2

    assert report["upload"]["size"] == 5_000_000 and report["upload"]["stat_size"] == 5_000_000
    assert report["upload"]["digest_matches"]
    assert report["upload"]["already_stored"] == [False, True]
    assert report["upload"]["wrong_digest"], "DATA_LOSS says which digest the bytes have"

    assert report["kv_keys"] == ["big/0", "big/1", "big/2"]
    assert report["kv_pages"] == 3, "3 MB values through a 4 MiB limit: one a page"

    assert "data.batch_size" in report["bad_spec"] and "-3" in report["bad_spec"]
    assert report["state"] == "SUCCEEDED", report["reason"]
    assert report["job_id"] == "go-1"
    # 2 epochs of 1024 samples in batches of 32 on 2 ranks.
    assert report["global_step"] == 32
    assert report["watch_updates"] >= 2
    assert report["metrics"]["test_acc"] > 0.8
    assert report["metric_points"]["train_loss"] >= 2 and report["metric_points"]["val_acc"] == 2
    assert "test_acc=" in report["test_log_line"] and report["log_lines"] > 10
    # The TensorBoard file, its framing checked with Go's CRC-32C: the scalars metrics.csv has.
    assert report["event_tags"]["train_loss"] == report["metric_points"]["train_loss"]
    assert report["event_tags"]["val_acc"] == 2

    # What Go fetched from the store is a checkpoint Python's torch reads.
    assert os.path.getsize(checkpoint) == report["checkpoint_bytes"]
    loaded = torch.load(checkpoint)
    assert loaded["global_step"] == 32 and loaded["epoch"] == 1
    assert any(k.endswith("weight") for k in loaded["state_dict"])


def test_a_go_client_over_mutual_tls_with_a_token(tmp_path):
    """Go's crypto/tls against the coordinator's TLS: the handshake and ALPN, the token."""
    from conftest import Cluster

    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    certs = tmp_path / "certs"
    subprocess.run(["bash", os.path.join(source, "deploy/tls/make-test-certs.sh"), str(certs)],
                   check=True, capture_output=True)
    token_file = tmp_path / "token"
    token_file.write_text("go-s3cret\n")
    c = Cluster(str(tmp_path), workers=0, coordinator_flags=[
        f"--tls_cert={certs}/server.pem", f"--tls_key={certs}/server.key",
        f"--tls_ca={certs}/ca.pem", "--tls_require_client_cert", f"--token_file={token_file}"])
    try:
        run = subprocess.run(
            [go_client(), f"--address={c.address}", f"--tls_ca={certs}/ca.pem",
             f"--tls_cert={certs}/client.pem", f"--tls_key={certs}/client.key",
             "--token=go-s3cret"],
            capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"the Go client failed:\n{run.stderr}"
        report = json.loads(run.stdout)
    finally:
        c.stop()
    assert report["alpn"] == "h2", "newer grpc-go refuses a TLS server that does not speak ALPN"
    assert report["tls_version"] in (0x0303, 0x0304), "TLS 1.2 or 1.3"
    assert report["no_token"] and report["wrong_token"]
    # UNAVAILABLE at once (Go checked the code): the handshake failed, no deadline ran out.
    assert "deadline" not in report["no_client_certificate"]


def test_every_rpc_answers_hostile_input_from_go(tmp_path):
    """Every method of the coordinator and a worker, found through reflection, gets bytes that do
    not parse, an empty message, random messages from its descriptor and those with bytes
    changed (about a thousand calls, 16 at a time): each is answered with a status in time, no
    process falls, both still serve, and bytes that do not parse are INVALID_ARGUMENT naming the
    message."""
    import dtrain
    from conftest import Cluster

    c = Cluster(str(tmp_path), workers=1)
    try:
        worker_port = open(tmp_path / "w0.port").read().strip()
        run = subprocess.run(
            [go_client(), f"--address={c.address}", f"--hostile=127.0.0.1:{worker_port}"],
            capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, f"the Go client failed:\n{run.stderr}"
        report = json.loads(run.stdout)
        assert all(p.poll() is None for p in c.processes), "a service fell"
        # Random RegisterWorker calls may add workers of their own; w0 must still be there.
        with dtrain.Client(c.address) as client:
            assert "w0" in [w.name for w in client.workers()]
    finally:
        c.stop()
    codes = report["hostile_codes"]
    garbage = report["hostile_garbage"]
    # Reflection v1 is dtrain's own with Debian's gRPC 1.51 (tests/CMakeLists.txt says when);
    # a gRPC that serves it itself is not held to dtrain's answers.
    reflection_v1 = "grpc.reflection.v1.ServerReflection.ServerReflectionInfo"
    if os.environ.get("DTRAIN_OWN_REFLECTION_V1") == "1":
        assert reflection_v1 in codes
        # Both servers serve it, and each answer is checked below.
        assert len({a["server"] for a in garbage[reflection_v1]}) == 2, garbage[reflection_v1]
    else:
        codes.pop(reflection_v1, None)
        garbage.pop(reflection_v1, None)
    assert report["hostile_calls"] > 500
    assert "dtrain.v1.Jobs.SubmitJob" in codes and "dtrain.v1.Worker.Setup" in codes
    # Calls that may wait for other ranks, a group or a value: the only ones a 5 s deadline
    # may end. Every other call must be answered by the service.
    may_wait = {f"dtrain.v1.Coordinator.{m}" for m in (
        "Register", "Barrier", "ReduceBooleanDecision", "Session", "Broadcast", "AllGather",
        "Reduce", "AllReduce", "KeyValueGet")}
    may_wait |= {"dtrain.v1.Jobs.WatchJob", "dtrain.v1.Worker.Setup"}
    for method, seen in codes.items():
        # What a crash, a dropped connection or gRPC's own default answer would look like.
        banned = ["Unknown", "Unimplemented", "Internal", "Unavailable", "Canceled"]
        if method not in may_wait:
            banned.append("DeadlineExceeded")
        for code in banned:
            assert code not in seen, f"{method} answered {code}: {seen}"
    # Bytes that do not parse: INVALID_ARGUMENT, naming the message wherever the request is read
    # before the handler (unary, server-streaming) or parsed by the service (Register, Session,
    # Upload, reflection v1); the tensor collectives, read frame by frame, call the message
    # malformed and say why.
    assert set(garbage) == set(codes)
    for method, answers in garbage.items():
        for answer in answers:
            assert answer["code"] == "InvalidArgument", (method, answer)
            read_by_service = method.endswith(("Register", "Session", "Upload"))
            if answer["kind"] in ("unary", "server-streaming") or read_by_service:
                assert "does not parse as dtrain.v1." in answer["message"], (method, answer)
            if method.startswith("grpc.reflection.v1."):
                assert ("does not parse as grpc.reflection.v1.ServerReflectionRequest"
                        in answer["message"]), answer
            if method.endswith(("AllReduce", "AllGather", "Broadcast", "Reduce")):
                assert "malformed stream message: " in answer["message"], (method, answer)
