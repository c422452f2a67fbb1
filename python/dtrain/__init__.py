"""dtrain from Python: submit and watch jobs (Client, Job), join a coordinator group and run
collectives beside C++ ranks (ProcessGroup), export a LightningModule-style module (export), and
write any map-style dataset as WebDataset shards (data.write_shards). The stubs of the public
protocol are dtrain.v1 (generated from proto/ by the build).

    import dtrain
    job = dtrain.Client().submit("job.yaml")
    print(job.wait().metrics["test_acc"])
"""

from dtrain.client import Client, Job, is_terminal
from dtrain.errors import (
    Aborted,
    DataLoss,
    DeadlineExceeded,
    DtrainError,
    FailedPrecondition,
    InvalidArgument,
    JobFailed,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from dtrain import data
from dtrain.export import export
from dtrain.process_group import KeyValueStore, ProcessGroup
from dtrain.spec import load_spec
from dtrain._connection import TLS

__all__ = [
    "Client", "Job", "is_terminal", "ProcessGroup", "KeyValueStore", "export", "load_spec", "TLS",
    "data",
    "DtrainError", "InvalidArgument", "NotFound", "FailedPrecondition", "DeadlineExceeded",
    "Aborted", "Unavailable", "Unauthenticated", "JobFailed", "DataLoss", "PermissionDenied",
]
