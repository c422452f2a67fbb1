"""Client and Job: submitting and watching jobs from Python, the calls `dtrain` makes.

    import dtrain
    client = dtrain.Client()                       # DTRAIN_COORDINATOR, DTRAIN_TOKEN
    job = client.submit("job.yaml", overrides={"trainer.max_epochs": 2})
    for status in job.watch():
        print(status.progress.epoch, status.progress.global_step)
    print(job.results()["metrics"]["test_acc"])
    job.download("best", "ckpts/")                 # the best checkpoint, verified
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional

import grpc

from dtrain._connection import Connection, TLSArg
from dtrain.artifacts import fetch, upload_spec_files
from dtrain.errors import (DeadlineExceeded, FailedPrecondition, InvalidArgument, JobFailed,
                           NotFound, from_rpc_error)
from dtrain.shard_upload import ShardUpload, upload_shards
from dtrain.spec import SpecLike, is_http_url, lexically_normal, load_spec
from dtrain.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, workers_pb2, workers_pb2_grpc

TERMINAL = (jobs_pb2.SUCCEEDED, jobs_pb2.FAILED, jobs_pb2.CANCELLED)


def is_terminal(status: jobs_pb2.JobStatus) -> bool:
    """True when the job has ended (SUCCEEDED, FAILED or CANCELLED)."""
    return status.state in TERMINAL


class Job:
    """One job of the coordinator, by id. Every method asks the coordinator afresh."""

    def __init__(self, client: "Client", job_id: str):
        self._client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> jobs_pb2.JobStatus:
        """The job's JobStatus now: state, progress, metrics, checkpoints, reason."""
        return self._client._call(self._client._jobs.GetJob, jobs_pb2.GetJobRequest(id=self.id))

    def watch(self, timeout: Optional[float] = None) -> Iterator[jobs_pb2.JobStatus]:
        """Yields the job's status at each update; the last one is terminal. ``timeout`` bounds
        the whole watch (DeadlineExceeded after it)."""
        conn = self._client._conn
        try:
            stream = self._client._jobs.WatchJob(
                jobs_pb2.WatchJobRequest(id=self.id), timeout=timeout, metadata=conn.metadata)
            for status in stream:
                yield status
                if is_terminal(status):
                    stream.cancel()
                    return
        except grpc.RpcError as e:
            raise from_rpc_error(e, conn.address) from None

    def wait(self, timeout: Optional[float] = None) -> jobs_pb2.JobStatus:
        """Blocks until the job ends. Returns its final status when it SUCCEEDED; raises
        JobFailed (with the reason and that status) when it FAILED or was CANCELLED, and
        DeadlineExceeded when ``timeout`` seconds pass first."""
        last = None
        for last in self.watch(timeout=timeout):
            pass
        if last is None or not is_terminal(last):
            raise DeadlineExceeded(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"job {self.id} did not end within {timeout} s")
        if last.state != jobs_pb2.SUCCEEDED:
            raise JobFailed(last)
        return last

    def logs(self, follow: bool = False, poll_interval: float = 0.5) -> Iterator[str]:
        """The job's log lines. ``follow``: keep yielding new lines until the job ends."""
        next_line = 0
        while True:
            page = self._client._call(self._client._jobs.GetJobLogs,
                                      jobs_pb2.GetJobLogsRequest(id=self.id, from_line=next_line))
            yield from page.lines
            next_line = page.next_line
            if page.truncated:
                continue
            if not follow:
                return
            if is_terminal(self.status()):
                if not page.lines:
                    return
                continue
            time.sleep(poll_interval)

    def metrics(self) -> List[Dict[str, Any]]:
        """Every logged metric point, in order, as dicts: name, step, epoch, value,
        wall_unix_ms."""
        rows: List[Dict[str, Any]] = []
        start = 0
        while True:
            page = self._client._call(self._client._jobs.GetJobMetrics,
                                      jobs_pb2.GetJobMetricsRequest(id=self.id, from_point=start))
            for p in page.points:
                rows.append({"name": p.name, "step": p.step, "epoch": p.epoch, "value": p.value,
                             "wall_unix_ms": p.wall_unix_ms})
            start = page.next_point
            if not page.truncated:
                return rows

    def results(self) -> Dict[str, Any]:
        """What `dtrain results --output json` prints: job, state, reason, metrics,
        checkpoint, best_checkpoint, log_dir, predictions, wall_seconds."""
        s = self.status()
        return {
            "job": s.id,
            "state": jobs_pb2.JobState.Name(s.state),
            "reason": s.reason,
            "metrics": dict(s.metrics),
            "checkpoint": s.checkpoint,
            "best_checkpoint": s.best_checkpoint,
            "log_dir": s.log_dir,
            "predictions": s.predictions,
            "files": [{"name": f.name, "kind": f.kind, "size_bytes": f.size_bytes,
                       "step": f.step, "location": f.location, "digest": f.digest}
                      for f in s.files],
            "wall_seconds": (s.finished_unix_ms - s.started_unix_ms) / 1000.0
            if s.finished_unix_ms > 0 else 0.0,
        }

    def files(self) -> List[jobs_pb2.JobFile]:
        """The files the job keeps: checkpoints (top k, last) and predictions (predictions.pt,
        batch_indices.pt, predictions.csv)."""
        return list(self.status().files)

    def download(self, which: str = "best", directory: str = ".") -> List[str]:
        """Brings the job's files to ``directory``, as `dtrain download`: ``which`` is best
        (by checkpoint.monitor, else the last), last, predictions (its three files), a file
        name, or all. Each is
        verified by its digest. Returns the local paths. NotFound naming what the job keeps;
        FailedPrecondition for a file on the workers' shared dirpath."""
        s = self.status()
        files = list(s.files)
        if which == "all":
            chosen = files
        elif which in ("best", "last"):
            want = s.best_checkpoint or s.checkpoint if which == "best" else s.checkpoint
            chosen = [f for f in files if f.location == want]
        elif which == "predictions":
            # All of them: predictions.pt, batch_indices.pt and predictions.csv.
            chosen = [f for f in files if f.kind == "predictions"]
        else:
            chosen = [f for f in files if f.name == which]
        if not chosen:
            raise NotFound(grpc.StatusCode.NOT_FOUND,
                           f"job '{self.id}' has no {which!r}; it keeps "
                           f"{', '.join(f.name for f in files) or 'none'}")
        os.makedirs(directory, exist_ok=True)
        paths = []
        for f in chosen:
            if not f.digest:
                raise FailedPrecondition(grpc.StatusCode.FAILED_PRECONDITION,
                                         f"{f.name} is on the workers' shared directory: "
                                         f"{f.location}")
            if "/" in f.name or f.name.startswith("."):
                raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                                      f"{f.name!r} is not a plain file name")
            paths.append(fetch(self._client._conn, f.digest, os.path.join(directory, f.name)))
        return paths

    def cancel(self) -> jobs_pb2.JobStatus:
        """Cancels the job on every worker; its status (CANCELLED once the workers stopped)."""
        return self._client._call(self._client._jobs.CancelJob,
                                  jobs_pb2.CancelJobRequest(id=self.id))


class Client:
    """The coordinator's Jobs and Workers services. ``address`` defaults to DTRAIN_COORDINATOR (then
    127.0.0.1:29610), ``token`` to DTRAIN_TOKEN; ``tls`` is None (plaintext unless
    DTRAIN_TLS_CA is set), True (the system's roots) or a TLS(ca, cert, key)."""

    def __init__(self, address: Optional[str] = None, token: Optional[str] = None,
                 tls: TLSArg = None, timeout: float = 10.0):
        self._conn = Connection(address, token, tls)
        self._jobs = jobs_pb2_grpc.JobsStub(self._conn.channel)
        self._workers = workers_pb2_grpc.WorkersStub(self._conn.channel)
        self.timeout = timeout
        self.uploaded: List[str] = []  # what the last submit sent (or found already there)

    @property
    def address(self) -> str:
        return self._conn.address

    def _call(self, method, request):
        return self._conn.call(method, request, timeout=self.timeout)

    def submit(self, spec: SpecLike, stage: str = "fit",
               overrides: Optional[Mapping[str, Any]] = None) -> Job:
        """Queues a job: ``spec`` is a dict, a YAML/JSON file path or a JobSpec; ``stage`` is
        fit, validate, test or predict (LightningCLI's subcommand); ``overrides`` maps dotted
        keys to values ({"trainer.max_epochs": 5}). The local files the spec names are uploaded
        to the coordinator first (``client.uploaded`` says which); a file already on every
        worker is written "worker:/path". Raises InvalidArgument naming the key."""
        request = jobs_pb2.SubmitJobRequest(spec=self._with_uploads(load_spec(spec, stage, overrides)))
        return Job(self, self._call(self._jobs.SubmitJob, request).job.id)

    def _with_uploads(self, spec: jobs_pb2.JobSpec) -> jobs_pb2.JobSpec:
        # The local files the spec names travel with it (dtrain.artifacts).
        self.uploaded = upload_spec_files(self._conn, spec)
        return spec

    def dry_run(self, spec: SpecLike, stage: str = "fit",
                overrides: Optional[Mapping[str, Any]] = None) -> worker_pb2.DryRunResponse:
        """Has an idle worker load the model and data and run one training_step and one
        validation_step; queues nothing. The report: batch structure, returned keys, loss."""
        request = jobs_pb2.SubmitJobRequest(spec=self._with_uploads(load_spec(spec, stage, overrides)),
                                            dry_run=True)
        return self._call(self._jobs.SubmitJob, request).dry_run

    def upload_shards(self, shards: str, field: str = "data.shards.train") -> ShardUpload:
        """Uploads local shards as a submit would (a brace pattern, a directory or a list file;
        a relative path against the working directory) and returns what it did: ``reference``
        ("artifact:sha256:<hex>", the list) names them in any later spec's data.shards split
        without hashing them again, and ``summary(field)`` is the line a submit prints. NotFound,
        InvalidArgument or DataLoss naming ``field`` and the shard (dtrain.shard_upload)."""
        path = os.fspath(shards)
        if not os.path.isabs(path) and not path.startswith(("worker:", "artifact:", "job:")) \
                and not is_http_url(path):
            path = lexically_normal(f"{os.getcwd()}/{path}")
        return upload_shards(self._conn, path, field)

    def get(self, job_id: str) -> Job:
        """The job with this id (NotFound if there is none)."""
        job = Job(self, job_id)
        job.status()
        return job

    def list(self) -> List[jobs_pb2.JobStatus]:
        """Every job, by submission time (following the coordinator's pages)."""
        out: List[jobs_pb2.JobStatus] = []
        token = ""
        while True:
            page = self._call(self._jobs.ListJobs, jobs_pb2.ListJobsRequest(page_token=token))
            out.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return out

    def delete(self, job_id: str) -> jobs_pb2.DeleteJobResponse:
        """Forgets an ended job and frees the stored files no other job names, as
        `dtrain delete`. FailedPrecondition while it is queued or running."""
        return self._conn.call(self._jobs.DeleteJob, jobs_pb2.DeleteJobRequest(id=job_id),
                               timeout=max(self.timeout, 90.0))

    def workers(self) -> List[workers_pb2.WorkerInfo]:
        """The registered workers (the Workers service): name, address, devices, state, job.
        Every page, by name."""
        out: List[workers_pb2.WorkerInfo] = []
        token = ""
        while True:
            r = self._call(self._workers.ListWorkers,
                           workers_pb2.ListWorkersRequest(page_token=token))
            out.extend(r.workers)
            if not r.next_page_token:
                return out
            if r.next_page_token == token:  # no progress: asking on would never end
                raise RuntimeError("the coordinator answered ListWorkers' page with its own token")
            token = r.next_page_token

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
