"""A real local cluster for the Python package's tests: a dtrain-coordinator and two
dtrain-worker processes on 127.0.0.1 (ephemeral ports), always reaped. The binaries come from
the environment ctest sets (DTRAIN_COORDINATOR_BIN, DTRAIN_WORKER_BIN, DTRAIN_DEMO_BIN)."""

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

# Modules in Lightning's idiom import pytorch_lightning: the real one where it is installed,
# else the tests' stand-in (lightning_standin/pytorch_lightning/__init__.py says why).
if importlib.util.find_spec("pytorch_lightning") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lightning_standin"))


def _binary(name):
    path = os.environ.get(name)
    if not path or not os.path.exists(path):
        pytest.fail(f"{name} is not set to a built binary (run the tests through ctest)")
    return path


def _wait_for_port(port_file, process, seconds=20.0):
    # args[3]: the binary, after setpriv and its flags (Cluster._start).
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[3]} exited with {process.returncode}")
        try:
            with open(port_file) as f:
                text = f.read().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{process.args[3]} wrote no port within {seconds} s")


class Cluster:
    def __init__(self, directory, workers=2, coordinator_flags=()):
        self.dir = directory
        self.processes = []
        port_file = os.path.join(directory, "coordinator.port")
        http_port_file = os.path.join(directory, "http.port")
        self.coordinator = self._start([
            _binary("DTRAIN_COORDINATOR_BIN"), "--listen=127.0.0.1:0", f"--port_file={port_file}",
            "--http_listen=127.0.0.1:0", f"--http_port_file={http_port_file}",
            f"--state_dir={directory}/state", "--heartbeat_timeout=6s", *coordinator_flags],
            "coordinator")
        self.address = f"127.0.0.1:{_wait_for_port(port_file, self.coordinator)}"
        # The dashboard and HTTP API (its port file is written before the gRPC one).
        self.url = f"http://127.0.0.1:{_wait_for_port(http_port_file, self.coordinator)}/"
        for i in range(workers):
            self.add_worker(f"w{i}")

    def _start(self, argv, log_name):
        log = open(os.path.join(self.dir, f"{log_name}.log"), "w")
        # Killed with pytest however pytest ends (ctest's timeout kills it; a test may have left
        # the coordinator SIGSTOPped), so nothing outlives the run. setpriv (util-linux, always
        # on Debian), not preexec_fn, which may deadlock in a process with threads. The signal
        # follows the thread that started the process: clusters start on pytest's main thread.
        process = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", *argv], stdout=log,
                                   stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def add_worker(self, name, flags=()):
        port_file = os.path.join(self.dir, f"{name}.port")
        worker = self._start([
            _binary("DTRAIN_WORKER_BIN"), f"--coordinator={self.address}", "--listen=127.0.0.1:0",
            f"--port_file={port_file}", f"--name={name}", "--threads=1", "--cpus=none",
            f"--cache_dir={self.dir}/cache-{name}", f"--jobs_dir={self.dir}/jobs-{name}",
            # A ctest entry runs some of these tests again with every rank in a child process.
            *os.environ.get("DTRAIN_TEST_WORKER_FLAGS", "").split(), *flags],
            name)
        _wait_for_port(port_file, worker)
        return worker

    def print_logs(self, lines=80):
        """The end of every process's log, for a failure's post-mortem in the test output."""
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    tail = f.readlines()[-lines:]
                print(f"----- {name} (last {len(tail)} lines) -----\n{''.join(tail)}")

    def stop(self):
        # Workers first (they leave cleanly), then the coordinator; SIGKILL if one hangs.
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def cluster(request):
    # DTRAIN_TEST_KEEP=1 keeps the cluster's logs (printed path) for a failure's post-mortem.
    keep = os.environ.get("DTRAIN_TEST_KEEP") == "1"
    with tempfile.TemporaryDirectory(prefix="dtrain-py-") as temporary:
        directory = tempfile.mkdtemp(prefix="dtrain-py-kept-") if keep else temporary
        if keep:
            print(f"cluster logs: {directory}")
        c = Cluster(directory)
        try:
            import dtrain

            client = dtrain.Client(c.address)
            deadline = time.monotonic() + 20
            while len([w for w in client.workers() if not w.job_id]) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("the workers did not register")
                time.sleep(0.1)
            client.close()
            failed_before = request.session.testsfailed
            yield c
            if request.session.testsfailed > failed_before:
                c.print_logs()
        finally:
            c.stop()


@pytest.fixture
def bare_coordinator():
    """A coordinator of its own (no workers), for groups and errors."""
    with tempfile.TemporaryDirectory(prefix="dtrain-py-") as directory:
        c = Cluster(directory, workers=0)
        try:
            yield c
        finally:
            c.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With DTRAIN_FAIL_ON_SKIP=1 (tests/run.sh sets it), a skipped test fails: ctest counts the
    whole pytest run as one test, so a skip inside it would otherwise pass unseen. No Python test
    may skip on CI (tests/allowed_skips.txt lists the C++ ones that may)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("DTRAIN_FAIL_ON_SKIP") == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} skipped ({reason}), and this run must not skip: give "
                           "it what it needs (docs/CONTRIBUTING.md, What the tests need)")
