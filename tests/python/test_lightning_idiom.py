"""Modules written as Lightning's documentation writes them (self.log in every step, an untyped
batch, self.current_epoch / global_step / hparams, save_hyperparameters()) export with no edits,
train on 2 ranks, equal a plain Python loop of the same module and data, and log what Lightning
would log under the names the user gave."""

import math
import os
import warnings

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

import dtrain
from dtrain.v1 import jobs_pb2


class LitClassifier(pl.LightningModule):
    # weight_decay and note are only recorded, for hparams.yaml: PyYAML reads 1e-05 as a string
    # (1.0e-05 is a float), refuses a raw DEL and breaks lines at U+2028.
    def __init__(self, hidden=32, lr=0.05, name="lit", sizes=(32, 10), weight_decay=1e-5,
                 note="caf\u00e9 \x7f \u2028 end", optimizer=None):
        super().__init__()
        self.save_hyperparameters()
        self.fc1 = torch.nn.Linear(32, hidden)
        self.fc2 = torch.nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", (logits.argmax(1) == y).float().mean(), on_step=True,
                 on_epoch=True)
        self.log("seen_epoch", self.current_epoch, on_step=False, on_epoch=True, reduce_fx="max")
        self.log("step_in_step", self.global_step)
        self.log("samples", float(x.shape[0]), on_step=False, on_epoch=True, reduce_fx="sum")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True, sync_dist=True)
        self.log_dict({"val_acc": (logits.argmax(1) == y).float().mean()})

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(1) == y).float().mean())

    def on_train_epoch_end(self):
        self.log("hparam_lr", self.hparams.lr)

    def on_predict_epoch_end(self, results):  # Lightning 1.x's signature
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class ReturnsDict(LitClassifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": F.cross_entropy(self(x), y)}


class UsesTrainer(LitClassifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.trainer.current_epoch > 1:
            return F.cross_entropy(self(x), y) * 2
        return F.cross_entropy(self(x), y)


class IndexesHparams(LitClassifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y) * self.hparams["lr"]


def data(n=384):
    torch.manual_seed(3)
    x = torch.randn(n, 32)
    y = x[:, :10].argmax(1)
    return x, y


def test_exports_with_no_edits_and_leaves_the_class_alone(tmp_path):
    x, y = data()
    model = LitClassifier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scripted = dtrain.export(model, str(tmp_path / "lit.pt"), (x[:8], y[:8]))
    assert any("on_predict_epoch_end(results)" in str(w.message) for w in caught)
    assert any("self.hparams leaves out optimizer" in str(w.message) for w in caught), \
        "None has no TorchScript type: said, not an error"
    loaded = torch.jit.load(str(tmp_path / "lit.pt"))
    # A NamedTuple in TorchScript (self.hparams.lr); Python sees its values in __init__'s order.
    assert tuple(loaded.hparams) == (32, 0.05, "lit", [32, 10], 1e-5, "caf\u00e9 \x7f \u2028 end")
    assert loaded.current_epoch == 0 and loaded.global_step == 0
    assert str(loaded.device) == "cpu"
    assert not hasattr(loaded, "on_predict_epoch_end")
    assert not hasattr(loaded, "on_train_start"), "Lightning's base hooks stay out"
    assert hasattr(loaded, "on_train_epoch_end")
    # The worker keeps the attributes current; the step reads them.
    loaded.current_epoch = 3
    dtrain.ops.logged.clear()
    loss = loaded.training_step((x[:8], y[:8]), 0)
    assert loss.requires_grad
    assert dtrain.ops.logged["seen_epoch"] == 3.0
    assert dtrain.ops.logged["samples"] == 8.0
    assert loaded.validation_step((x[:8], y[:8]), 0) is None
    # The user's class and instance are as they were: Lightning's log, no added attributes.
    assert type(model) is LitClassifier
    assert "current_epoch" not in model.__dict__ and model.current_epoch == 0
    model.training_step((x[:8], y[:8]), 0)
    assert "train_loss" in model.logged, "eager self.log is still Lightning's"
    assert scripted.training_step.code


def test_a_dict_with_loss_exports(tmp_path):
    x, y = data()
    out = dtrain.export(ReturnsDict(), str(tmp_path / "d.pt"), (x[:8], y[:8])).training_step(
        (x[:8], y[:8]), 0)
    assert set(out.keys()) == {"loss"}


@pytest.mark.parametrize("module, construct, rewrite", [
    (UsesTrainer(), "uses self.trainer", "self.current_epoch"),
    (IndexesHparams(), "uses self.hparams[...]", "self.hparams.NAME"),
])
def test_what_cannot_compile_is_named_at_its_line(tmp_path, module, construct, rewrite):
    x, y = data()
    with pytest.raises(dtrain.InvalidArgument) as bad:
        dtrain.export(module, str(tmp_path / "m.pt"), (x[:8], y[:8]))
    message = bad.value.message
    assert "test_lightning_idiom.py:" in message and construct in message and rewrite in message
    line = int(message.split("test_lightning_idiom.py:")[1].split(":")[0])
    with open(__file__) as f:
        source_line = f.read().splitlines()[line - 1]
    assert ("self.trainer" in source_line) or ('self.hparams["lr"]' in source_line)


def _plain_loop(x, y, epochs, global_batch, lr):
    """What one process computes: the same module, SGD, the same batches in the same order."""
    torch.manual_seed(11)
    model = LitClassifier()
    model.load_state_dict(_initial_state())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for first in range(0, x.shape[0], global_batch):
            xb, yb = x[first:first + global_batch], y[first:first + global_batch]
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
    return model


_INITIAL = {}


def _initial_state():
    if not _INITIAL:
        torch.manual_seed(11)
        _INITIAL.update({k: v.clone() for k, v in LitClassifier().state_dict().items()})
    return _INITIAL


def test_trains_on_two_ranks_as_one_process_and_logs_as_lightning(cluster, tmp_path):
    x, y = data()
    torch.save({"train": (x, y), "val": (x[:128], y[:128]), "test": (x[:128], y[:128])},
               str(tmp_path / "data.pt"))
    model = LitClassifier()
    model.load_state_dict(_initial_state())
    dtrain.export(model, str(tmp_path / "lit.pt"), (x[:8], y[:8]))
    epochs, per_rank = 3, 32
    client = dtrain.Client(cluster.address)
    job = client.submit({
        "name": "lit",
        "model": {"torchscript": str(tmp_path / "lit.pt")},
        # In order, so that rank r's k-th batch is the plain loop's k-th batch's r-th half.
        "data": {"tensors_file": str(tmp_path / "data.pt"), "batch_size": per_rank,
                 "shuffle": False},
        "trainer": {"max_epochs": epochs, "num_nodes": 2, "log_every_n_steps": 2,
                    "batches_per_call": 5},
        "optimizer": {"name": "sgd", "lr": 0.05},
        "seed_everything": 1,
    })
    status = job.wait(timeout=300)
    assert status.state == jobs_pb2.SUCCEEDED, status.reason
    [last] = job.download("last", str(tmp_path / "ckpts"))
    checkpoint = torch.load(last, map_location="cpu")
    trained = checkpoint["state_dict"]
    # As Lightning's: the user's class is rebuilt from the checkpoint alone.
    assert checkpoint["hyper_parameters"] == {"hidden": 32, "lr": 0.05, "name": "lit",
                                              "sizes": [32, 10], "weight_decay": 1e-5,
                                              "note": "caf\u00e9 \x7f \u2028 end"}
    # hparams.yaml beside metrics.csv has them as well, after the resolved spec.
    import yaml
    with open(os.path.join(status.log_dir, "hparams.yaml")) as f:
        written = yaml.safe_load(f)
    assert written["hyper_parameters"] == checkpoint["hyper_parameters"]
    assert written["name"] == "lit", "the spec is still there"
    rebuilt = LitClassifier(**checkpoint["hyper_parameters"])
    rebuilt.load_state_dict(trained)
    final = _plain_loop(x, y, epochs, 2 * per_rank, 0.05)
    reference = final.state_dict()
    with torch.no_grad():
        assert (rebuilt(x[:16]) - final(x[:16])).abs().max().item() <= 1e-5
    moved = max((reference[k] - _initial_state()[k]).abs().max().item() for k in reference)
    diff = max((trained[k] - reference[k]).abs().max().item() for k in reference)
    assert moved > 0.01, "the parameters trained"
    assert diff <= 1e-5, f"2 ranks vs one process: max abs diff {diff}"

    # prog_bar=True keys, for `dtrain watch` and the dashboard.
    assert set(status.progress.prog_bar) == {"train_loss", "val_loss"}
    points = job.metrics()
    by_name = {}
    for p in points:
        by_name.setdefault(p["name"], []).append(p)
    steps_per_epoch = x.shape[0] // (2 * per_rank)
    # on_step only (training_step's default): a point every log_every_n_steps steps, named as
    # logged, although each call holds 5 batches.
    assert [p["step"] for p in by_name["train_loss"]] == list(
        range(2, epochs * steps_per_epoch + 1, 2))
    # self.global_step inside the step is the steps taken before it.
    assert all(p["value"] == p["step"] - 1 for p in by_name["step_in_step"])
    # on_step and on_epoch: _step points and one _epoch point per epoch.
    assert len(by_name["train_acc_step"]) == len(by_name["train_loss"])
    assert len(by_name["train_acc_epoch"]) == epochs
    assert "train_acc" not in by_name
    # Epoch aggregates over both ranks: max of current_epoch, sum of batch sizes.
    assert [p["value"] for p in by_name["seen_epoch"]] == [0.0, 1.0, 2.0]
    assert [p["value"] for p in by_name["samples"]] == [float(x.shape[0])] * epochs
    # An epoch-end hook's value, read from self.hparams.
    assert [p["value"] for p in by_name["hparam_lr"]] == [0.05] * epochs
    # Validation: named as logged (not val_val_loss), the mean over all 128 samples.
    assert "val_val_loss" not in by_name and len(by_name["val_loss"]) == epochs
    with torch.no_grad():
        logits = final(x[:128])
        expected_loss = F.cross_entropy(logits, y[:128]).item()
        expected_acc = (logits.argmax(1) == y[:128]).float().mean().item()
    assert math.isclose(by_name["val_loss"][-1]["value"], expected_loss, abs_tol=1e-5)
    assert math.isclose(by_name["val_acc"][-1]["value"], expected_acc, abs_tol=1e-6)
    assert math.isclose(status.metrics["test_acc"], expected_acc, abs_tol=1e-6)
