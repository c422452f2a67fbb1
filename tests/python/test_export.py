"""dtrain.export: a LightningModule-style module scripted, checked on an example batch and
saved; the TorchScript pitfalls come back as what to change; the file trains in a real job."""

from typing import Dict, Tuple

import pytest
import torch
import torch.nn.functional as F

import dtrain
from dtrain.v1 import jobs_pb2


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.drop = torch.nn.Dropout(0.1)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.fc1(x))))

    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        logits = self(x)
        return {"loss": F.cross_entropy(logits, y),
                "acc": (logits.argmax(1) == y).float().mean()}

    def validation_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        logits = self(x)
        return {"loss": F.cross_entropy(logits, y),
                "acc": (logits.argmax(1) == y).float().mean()}


class Logs(Classifier):
    def training_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss


class Untyped(Classifier):
    def training_step(self, batch, batch_idx: int):
        x, y = batch
        return F.cross_entropy(self(x), y)


class ReturnsNone(Classifier):
    def predict_step(self, batch: Tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        logits = self(x)
        if bool(logits.sum() > 1e9):
            return logits
        return None


class NoTraining(torch.nn.Module):
    def forward(self, x):
        return x


def example():
    torch.manual_seed(0)
    return torch.randn(8, 32), torch.randint(0, 10, (8,))


def test_export_checks_and_saves(tmp_path):
    model = Classifier()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = tmp_path / "models" / "classifier.pt"
    scripted = dtrain.export(model, str(path), example())
    assert path.exists()
    loaded = torch.jit.load(str(path))
    assert hasattr(loaded, "training_step") and hasattr(loaded, "validation_step")
    out = loaded.training_step(example(), 0)
    assert set(out.keys()) == {"loss", "acc"}
    for k, v in scripted.state_dict().items():
        assert torch.equal(v, before[k]), "the trial steps left the parameters as they were"
    assert dtrain.export.__doc__


def test_self_log_and_an_untyped_batch_export_on_a_plain_module(tmp_path):
    """Not only LightningModule subclasses (tests/python/test_lightning_idiom.py): an nn.Module
    that calls self.log and leaves its batch untyped scripts too."""
    from dtrain import ops
    for module in (Logs(), Untyped()):
        ops.logged.clear()
        scripted = dtrain.export(module, str(tmp_path / "m.pt"), example())
        assert scripted.training_step(example(), 0).requires_grad
        assert ("train_loss" in ops.logged) == isinstance(module, Logs)
        assert not hasattr(type(module), "current_epoch"), "the class is left as it was"


@pytest.mark.parametrize("module, message", [
    (ReturnsNone(), "predict_step returned None"),
    (NoTraining(), "the module has no training_step"),
])
def test_export_pitfalls_say_what_to_change(tmp_path, module, message):
    with pytest.raises(dtrain.InvalidArgument) as bad:
        dtrain.export(module, str(tmp_path / "m.pt"), example())
    assert message in bad.value.message
    assert not (tmp_path / "m.pt").exists()


def test_exported_module_trains_in_a_job(cluster, tmp_path):
    torch.manual_seed(1)
    x = torch.randn(512, 32)
    y = (x[:, :10].argmax(1))
    torch.save({"train": (x[:384], y[:384]), "val": (x[384:], y[384:]),
                "test": (x[384:], y[384:])}, str(tmp_path / "data.pt"))
    dtrain.export(Classifier(), str(tmp_path / "model.pt"), (x[:8], y[:8]))
    client = dtrain.Client(cluster.address)
    job = client.submit({
        "name": "exported",
        "model": {"torchscript": str(tmp_path / "model.pt")},
        "data": {"tensors_file": str(tmp_path / "data.pt"), "batch_size": 32},
        "trainer": {"max_epochs": 5, "num_nodes": 2, "skip_test": True},
        "optimizer": {"name": "adam", "lr": 0.01},
        "seed_everything": 1,
    })
    status = job.wait(timeout=300)
    assert status.state == jobs_pb2.SUCCEEDED
    # Both files travelled with the job, by content.
    assert [line.split(":")[0] for line in client.uploaded] == ["model.torchscript",
                                                                 "data.tensors_file"]
    assert job.status().spec.model.torchscript.startswith("artifact:sha256:")
    assert status.metrics["val_acc"] > 0.5
    assert "train_acc" in status.metrics
