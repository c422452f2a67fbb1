"""Python ranks in coordinator groups: every collective with numpy and torch, mixed with a C++
rank (dtrain-collectives-demo, the C++ client library) in one group, the named errors, and
health through a coordinator that falls silent."""

import os
import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest
import torch

import dtrain


def run_ranks(n, body, address, group, world_size=None, **kwargs):
    """Runs body(pg) on n Python ranks (threads) of a group of world_size (default n) ranks;
    their results by rank."""
    results, errors = {}, []

    def rank_main():
        try:
            with dtrain.ProcessGroup(group, world_size or n, address, collective_timeout=20,
                                     **kwargs) as pg:
                results[pg.rank] = body(pg)
        except BaseException as e:  # reported below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=rank_main) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return results


def test_every_collective_numpy_and_torch(bare_coordinator):
    def body(pg):
        r = pg.rank
        out = {}
        pg.barrier("start")
        out["sum"] = pg.all_reduce(np.array([r, r + 1, r + 2], np.float32))
        out["mean"] = pg.all_reduce(torch.tensor([float(r), 10.0], dtype=torch.float64), op="mean")
        out["max"] = pg.all_reduce(np.array([r * 7 % 3], np.int64), op="max")
        out["bf16"] = pg.all_reduce(torch.full((4,), float(r + 1), dtype=torch.bfloat16))
        # Uneven first dimensions: rank r sends r + 1 rows.
        out["gather"] = pg.all_gather(torch.arange((r + 1) * 2, dtype=torch.int32).reshape(r + 1, 2))
        out["bcast"] = pg.broadcast(np.arange(5, dtype=np.uint8) if r == 1 else None, src=1)
        out["bytes"] = pg.broadcast_bytes(b"from rank 0" if r == 0 else None, src=0)
        out["reduce"] = pg.reduce(np.full((2, 2), r + 1, np.float32), dst=2, op="product")
        out["any"] = pg.reduce_boolean_decision(r == 2, all=False)
        out["all"] = pg.reduce_boolean_decision(r == 2, all=True)
        # Over 4 MiB: the all-reduce travels as segments, the result comes back whole.
        big = np.full(3_000_000, r + 1, np.float32)
        out["big"] = pg.all_reduce(big)
        pg.store.set(f"key-{r}", f"value-{r}")
        out["counter"] = pg.store.add("counter", r + 1)
        pg.barrier("stored")
        out["kv"] = pg.store.list("key-")
        out["waited"] = pg.store.get("key-0", timeout=5)
        out["info"] = (pg.world_size, pg.local_rank, pg.generation)
        return out

    results = run_ranks(3, body, bare_coordinator.address, "py-group")
    assert sorted(results) == [0, 1, 2]
    for r, out in results.items():
        np.testing.assert_array_equal(out["sum"], np.array([3, 6, 9], np.float32))
        assert isinstance(out["mean"], torch.Tensor) and out["mean"].dtype == torch.float64
        assert out["mean"].tolist() == [1.0, 10.0]
        assert out["max"].tolist() == [2]  # r * 7 % 3 for r = 0, 1, 2: 0, 1, 2
        assert out["bf16"].dtype == torch.bfloat16 and out["bf16"].tolist() == [6.0] * 4
        assert [p.shape[0] for p in out["gather"]] == [1, 2, 3]
        assert all(isinstance(p, torch.Tensor) and p.dtype == torch.int32 for p in out["gather"])
        assert out["gather"][2].flatten().tolist() == list(range(6))
        np.testing.assert_array_equal(out["bcast"], np.arange(5, dtype=np.uint8))
        assert out["bytes"] == b"from rank 0"
        if r == 2:
            np.testing.assert_array_equal(out["reduce"], np.full((2, 2), 6, np.float32))
        else:
            assert out["reduce"] is None
        assert out["any"] is True and out["all"] is False
        assert out["big"].shape == (3_000_000,) and float(out["big"].min()) == 6.0 == float(out["big"].max())
        assert out["kv"] == [(f"key-{i}", f"value-{i}".encode()) for i in range(3)]
        assert out["waited"] == b"value-0"
        assert out["info"][0] == 3 and out["info"][2] >= 1
    assert sorted(out["counter"] for out in results.values())[-1] == 6


def test_member_list_false_leaves_the_list_out_and_says_so(bare_coordinator):
    """A rank that goes without the member list gets the rest of its assignment; the others in
    the same group still get every member."""
    def body(pg):
        try:
            members = [(m.rank, m.name) for m in pg.members]
        except RuntimeError as e:
            members = str(e)
        return members, (pg.world_size, pg.local_world_size, pg.num_nodes)

    lock = threading.Lock()
    joined = []

    def rank_main():
        with lock:
            index = len(joined)
            joined.append(index)
        try:
            with dtrain.ProcessGroup("py-omit", 3, bare_coordinator.address, name=f"m{index}",
                                     host="h", order_key=f"m{index}", collective_timeout=20,
                                     member_list=index != 1) as pg:
                results[pg.rank] = body(pg)
        except BaseException as e:
            errors.append(e)

    results, errors = {}, []
    threads = [threading.Thread(target=rank_main) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, errors
    assert sorted(results) == [0, 1, 2]
    for r in (0, 2):
        assert results[r] == ([(0, "m0"), (1, "m1"), (2, "m2")], (3, 3, 1))
    members, sizes = results[1]
    assert sizes == (3, 3, 1)
    assert "'py-omit' was joined with member_list=False" in members


def test_python_and_cpp_ranks_in_one_group(bare_coordinator):
    demo = os.environ["DTRAIN_DEMO_BIN"]
    cpp = subprocess.Popen([demo, f"--coordinator={bare_coordinator.address}", "--group=mixed",
                            "--world_size=3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        # The demo's sequence, from the Python side.
        def body(pg):
            pg.barrier("start")
            greeting = pg.broadcast_bytes(b"hello from rank 0" if pg.rank == 0 else None, src=0)
            r = float(pg.rank)
            total = pg.all_reduce(np.array([r, r + 1, r + 2], np.float32))
            parts = pg.all_gather(np.array([r, r + 1, r + 2], np.float32))
            stop = pg.reduce_boolean_decision(pg.rank == 0, all=False)
            pg.barrier("end")
            return greeting, total, parts, stop

        results = run_ranks(2, body, bare_coordinator.address, "mixed", world_size=3)
        output, _ = cpp.communicate(timeout=60)
    finally:
        if cpp.poll() is None:
            cpp.kill()
            cpp.wait()
    assert cpp.returncode == 0, output
    assert "all_reduce sum [3, 6, 9], all_gather 3 parts, any-stop true" in output
    assert "broadcast 'hello from rank 0'" in output
    for greeting, total, parts, stop in results.values():
        assert greeting == b"hello from rank 0"
        np.testing.assert_array_equal(total, np.array([3, 6, 9], np.float32))
        assert len(parts) == 3 and stop is True
    ranks = sorted(results)
    assert len(ranks) == 2 and set(ranks) <= {0, 1, 2}


def test_named_errors(bare_coordinator):
    address = bare_coordinator.address

    # Ranks that disagree: FailedPrecondition naming what each called.
    def mismatched(pg):
        if pg.rank == 0:
            return pg.all_reduce(np.ones(3, np.float32))
        return pg.barrier("other")

    with pytest.raises(dtrain.FailedPrecondition) as disagree:
        run_ranks(2, mismatched, address, "mismatch")
    assert disagree.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "rank" in disagree.value.message

    # Bad input of this call: InvalidArgument, and the rank stays in step afterwards.
    def bad_input(pg):
        with pytest.raises(dtrain.InvalidArgument):
            pg.all_reduce(np.ones(3, np.complex64))
        with pytest.raises(dtrain.InvalidArgument, match="unknown reduce op"):
            pg.all_reduce(np.ones(3, np.float32), op="median")
        return pg.all_reduce(np.ones(2, np.float32)).tolist()

    assert all(v == [2.0, 2.0] for v in run_ranks(2, bad_input, address, "bad-input").values())

    # A rank that never arrives: DeadlineExceeded naming it. Rank 1 stays in the group, silent,
    # until rank 0 has its answer.
    answered = threading.Event()

    def late(pg):
        if pg.rank == 0:
            try:
                with pytest.raises(dtrain.DeadlineExceeded) as missed:
                    pg.barrier("wait", timeout=1.0)
            finally:
                answered.set()
            assert "rank 1" in missed.value.message
            return True
        assert answered.wait(timeout=30), "rank 0's barrier never ended"
        return True

    run_ranks(2, late, address, "late")

    # A rank whose process stops heartbeating: Aborted on the survivor, naming the dead one.
    def dead(pg):
        if pg.rank == 1:
            pg._stop.set()  # as a hung process: no more heartbeats, no leave
            pg._left = True
            return True
        with pytest.raises(dtrain.Aborted) as aborted:
            pg.barrier("after", timeout=30)
        assert "rank 1" in aborted.value.message and "dead" in aborted.value.message
        return True

    run_ranks(2, dead, address, "dead")

    # Joining waits for a coordinator that is not there yet, within register_timeout.
    with pytest.raises(dtrain.DeadlineExceeded):
        dtrain.ProcessGroup("none", 1, "127.0.0.1:1", register_timeout=0.5)


def _heartbeat_cluster(tmp_path, timeout):
    """A coordinator alone, with 100 ms heartbeats and the given heartbeat timeout."""
    from conftest import Cluster

    flags = ("--heartbeat_interval=100ms", f"--heartbeat_timeout={timeout}")
    return Cluster(str(tmp_path), workers=0, coordinator_flags=flags)


def _await_verdict(pg, seconds):
    """The first non-None health() within `seconds` (None if none), and when it came."""
    start = time.monotonic()
    verdict = None
    while verdict is None and time.monotonic() - start < seconds:
        verdict = pg.health()
        time.sleep(0.01)
    return verdict, time.monotonic() - start


def test_health_waits_out_a_silent_coordinator_then_names_it(tmp_path):
    """A coordinator that stops answering (SIGSTOP) for less than the heartbeat timeout leaves
    every rank's health None and the group working; past the timeout, health names it."""
    c = _heartbeat_cluster(tmp_path, "2s")
    pid = c.coordinator.pid
    both = threading.Barrier(2, timeout=60)
    try:
        def body(pg):
            pg.barrier("before")
            both.wait()
            # 1 s silent, half the timeout: the heartbeats in flight go unanswered.
            if pg.rank == 0:
                os.kill(pid, signal.SIGSTOP)
            seen = []
            until = time.monotonic() + 1.0
            while time.monotonic() < until:
                seen.append(pg.health())
                time.sleep(0.01)
            both.wait()
            if pg.rank == 0:
                os.kill(pid, signal.SIGCONT)
            pg.barrier("after a short silence")
            # A heartbeat answered since the thaw, so the next silence is timed from now.
            time.sleep(0.3)
            assert pg.health() is None, pg.health()
            # Silent past the timeout.
            both.wait()
            if pg.rank == 0:
                os.kill(pid, signal.SIGSTOP)
            verdict, took = _await_verdict(pg, 15)
            both.wait()
            if pg.rank == 0:
                os.kill(pid, signal.SIGCONT)
            try:
                pg.leave()
            except dtrain.DtrainError:
                pass  # the coordinator, back, may have declared the group dead meanwhile
            return [h for h in seen if h is not None], verdict, took

        results = run_ranks(2, body, c.address, "patience")
    finally:
        os.kill(pid, signal.SIGCONT)
        c.stop()
    for r, (bad, verdict, took) in results.items():
        assert bad == [], f"rank {r}: health during a short silence: {bad[0]}"
        assert isinstance(verdict, dtrain.Unavailable), f"rank {r}: {verdict!r}"
        assert f"the coordinator at {c.address} has answered no heartbeat for" in verdict.message
        assert "heartbeat timeout 2s" in verdict.message
        # The verdict comes mid-run: no advice to start a cluster, no "cannot reach ADDR" wrapping.
        assert "deploy/local/cluster.sh" not in verdict.message, verdict.message
        assert "cannot reach" not in verdict.message, verdict.message
        assert 1.5 <= took < 6, f"rank {r}: reported after {took:.2f} s"


def test_health_names_a_coordinator_shutdown_at_once(tmp_path):
    """A coordinator stopped cleanly (SIGTERM) tells every rank by its next heartbeat's answer,
    not after the heartbeat timeout (20 s here) of a silent one."""
    c = _heartbeat_cluster(tmp_path, "20s")
    both = threading.Barrier(2, timeout=60)
    try:
        def body(pg):
            pg.barrier("before")
            both.wait()
            if pg.rank == 0:
                c.coordinator.send_signal(signal.SIGTERM)
            verdict, took = _await_verdict(pg, 30)
            try:
                pg.leave()
            except dtrain.DtrainError:
                pass  # the coordinator is gone
            return verdict, took

        results = run_ranks(2, body, c.address, "shutdown")
        # It stopped by itself, promptly: it waited only for both ranks' heartbeats.
        assert c.coordinator.wait(timeout=10) == 0
    finally:
        c.stop()
    for r, (verdict, took) in results.items():
        assert isinstance(verdict, dtrain.FailedPrecondition), f"rank {r}: {verdict!r}"
        assert "the coordinator is shutting down" in verdict.message, verdict.message
        assert "group 'shutdown' ends with it" in verdict.message, verdict.message
        assert took < 5, f"rank {r}: reported after {took:.2f} s"


def test_store_list_pages_past_a_default_clients_4_mib(bare_coordinator):
    # Three values of 3 MB: no answer holds two within grpcio's default 4 MiB receive limit,
    # so the list arrives as three pages, each resumed after the key before.
    values = {f"big-{i}": bytes([65 + i]) * 3_000_000 for i in range(3)}

    def body(pg):
        for key, value in values.items():
            pg.store.set(key, value)
        pg.store.set("small", "s")
        return pg.store.list("big-"), pg.store.list()

    listed, everything = run_ranks(1, body, bare_coordinator.address, "py-pages")[0]
    assert [k for k, _ in listed] == ["big-0", "big-1", "big-2"]
    assert all(v == values[k] for k, v in listed)
    assert [k for k, _ in everything] == ["big-0", "big-1", "big-2", "small"]
