"""torch.ops.dtrain from Python: a world of one at export time, the same schemas as the worker's
C++ operators, and a model whose loss gathers embeddings across ranks trained by a real job."""

import json
import os
import subprocess
import sys
from typing import Tuple

import pytest
import torch

import dtrain
import dtrain.ops
from dtrain.v1 import jobs_pb2


class Contrastive(torch.nn.Module):
    """Two views of each sample (the input and a scaled copy); the second view's embeddings of
    every rank are the candidates, with gradients flowing back to the rank that made them."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                         torch.nn.Linear(32, 16))

    def forward(self, x):
        return torch.tanh(self.embed(x))

    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, _ = batch
        z1 = self(x)
        z2 = self(x * 0.9)
        everyone = torch.ops.dtrain.all_gather(z2, True).flatten(0, 1)
        logits = z1 @ everyone.t() / 0.5
        targets = torch.arange(z1.size(0)) + torch.ops.dtrain.global_rank() * z1.size(0)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        torch.ops.dtrain.log("loss_synced", loss, True)
        torch.ops.dtrain.log("world", torch.tensor(float(torch.ops.dtrain.world_size())))
        return loss

    def validation_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, _ = batch
        z = self(x)
        agree = (z @ self(x * 0.9).t()).argmax(1) == torch.arange(z.size(0))
        torch.ops.dtrain.log("acc_max", agree.float().mean(), True, "max")
        return {"acc": agree.float().mean()}


def test_a_world_of_one_in_python(tmp_path):
    x = torch.randn(8, 32)
    scripted = dtrain.export(Contrastive(), str(tmp_path / "m.pt"), (x, torch.zeros(8).long()))
    # The calls survive scripting, in the code the worker loads.
    assert "ops.dtrain.all_gather(" in scripted.training_step.code
    assert "ops.dtrain.log(" in scripted.training_step.code
    loss = scripted.training_step((x, torch.zeros(8, dtype=torch.long)), 0)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in scripted.parameters())
    assert dtrain.ops.logged["world"] == 1.0
    assert dtrain.ops.logged["loss_synced"] == pytest.approx(float(loss))
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    assert torch.ops.dtrain.all_gather(t).shape == (1, 2)
    assert torch.equal(torch.ops.dtrain.all_reduce(t, "max"), t.detach())
    assert torch.ops.dtrain.reduce_boolean_decision(False, True) is False
    with pytest.raises(RuntimeError, match="unknown reduce op 'median'"):
        torch.ops.dtrain.all_reduce(t, "median")
    with pytest.raises(RuntimeError, match="src 1 is not a rank of this world of 1"):
        torch.ops.dtrain.broadcast(t, 1)
    with pytest.raises(RuntimeError, match="'v' must be one value"):
        torch.ops.dtrain.log("v", t)


_PRINT_SCHEMAS = """
import json, sys, torch
if len(sys.argv) > 1:
    torch.ops.load_library(sys.argv[1])
import dtrain.ops
print(json.dumps(dtrain.ops.registered_schemas()))
"""


def _schemas(*library):
    out = subprocess.run([sys.executable, "-c", _PRINT_SCHEMAS, *library], check=True,
                         capture_output=True, text=True, env=os.environ)
    return json.loads(out.stdout)


def test_the_schemas_are_the_workers():
    library = os.environ.get("DTRAIN_OPS_LIBRARY")
    if not library or not os.path.exists(library):
        pytest.fail("DTRAIN_OPS_LIBRARY is not set to the built libdtrain_ops.so (run through ctest)")
    python, worker = _schemas(), _schemas(library)
    assert len(python) == len(dtrain.ops.SCHEMAS) == 8
    assert python == worker


def test_export_scripts_the_ops_and_a_ddp_job_trains_with_them(cluster, tmp_path):
    torch.manual_seed(2)
    x = torch.randn(512, 32)
    y = torch.zeros(512, dtype=torch.long)
    torch.save({"train": (x[:384], y[:384]), "val": (x[384:], y[384:])},
               str(tmp_path / "data.pt"))
    dtrain.export(Contrastive(), str(tmp_path / "model.pt"), (x[:8], y[:8]))
    client = dtrain.Client(cluster.address)
    job = client.submit({
        "name": "contrastive",
        "model": {"torchscript": str(tmp_path / "model.pt")},
        "data": {"tensors_file": str(tmp_path / "data.pt"), "batch_size": 16},
        "trainer": {"max_epochs": 3, "num_nodes": 2, "skip_test": True, "strategy": "ddp",
                    "log_every_n_steps": 4},
        "optimizer": {"name": "adam", "lr": 0.01},
        "seed_everything": 1,
    })
    status = job.wait(timeout=300)
    assert status.state == jobs_pb2.SUCCEEDED, status.reason
    # Logged by model code on 2 ranks, under the names it gave: world_size() said 2, and the
    # synced loss is reported.
    assert status.metrics["world"] == 2.0
    assert 0 < status.metrics["loss_synced"] < 5
    assert 0 < status.metrics["acc_max"] <= 1
    assert status.metrics["val_acc"] > 0.5
