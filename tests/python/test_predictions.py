"""predict writes what Lightning's trainer.predict returns: predictions.pt, a list with one entry
per batch exactly as predict_step returned it (a tensor, a dict of tensors, a list or tuple of
tensors, any shape and dtype), which torch.load reads (weights_only too), with batch_indices.pt
naming each entry's samples, on real workers."""

import csv
import os

import pytest
import pytorch_lightning as pl
import torch

import dtrain
from dtrain.v1 import jobs_pb2


class Predictor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x):
        return self.fc(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)


class ReturnsDict(Predictor):
    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        logits = self(x)
        return {"logits": logits, "label": logits.argmax(1),
                "pairs": logits.reshape(-1, 2, 2).to(torch.float64), "score": logits.max(1)[0]}


class ReturnsTensor(Predictor):
    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        return self(x)


class ReturnsTuple(Predictor):
    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        logits = self(x)
        return logits.softmax(1), logits.argmax(1).to(torch.int32)


def _run(cluster, tmp_path, module, name):
    torch.manual_seed(9)
    x = torch.randn(23, 6)
    y = torch.randint(0, 4, (23,))
    data = str(tmp_path / f"{name}.data.pt")
    torch.save({"train": (x, y), "test": (x, y)}, data)
    model_path = str(tmp_path / f"{name}.pt")
    dtrain.export(module, model_path, (x[:5], y[:5]))
    client = dtrain.Client(cluster.address)
    # 23 samples on 2 ranks in batches of 5: rank 0 has 12 (5, 5, 2), rank 1 11 (5, 5, 1).
    job = client.submit({
        "name": name,
        "model": {"torchscript": model_path},
        "data": {"tensors_file": data, "batch_size": 5, "eval_batch_size": 5},
        "trainer": {"num_nodes": 2},
    }, stage="predict")
    status = job.wait(timeout=300)
    assert status.state == jobs_pb2.SUCCEEDED, status.reason
    files = job.download("predictions", str(tmp_path / name))
    by_name = {os.path.basename(f): f for f in files}
    assert set(by_name) == {"predictions.pt", "batch_indices.pt", "predictions.csv"}
    predictions = torch.load(by_name["predictions.pt"], weights_only=True)
    indices = torch.load(by_name["batch_indices.pt"], weights_only=True)
    return x, predictions, indices, by_name["predictions.csv"]


def _check_order(indices):
    # Ordered by batch index, then rank; rank r's batches hold samples r, r + 2, ...
    assert indices == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9], [10, 12, 14, 16, 18],
                       [11, 13, 15, 17, 19], [20, 22], [21]]


def test_a_dict_of_tensors_of_any_shape(cluster, tmp_path):
    module = ReturnsDict()
    x, predictions, indices, csv_path = _run(cluster, tmp_path, module, "pred-dict")
    _check_order(indices)
    assert isinstance(predictions, list) and len(predictions) == 6
    with torch.no_grad():
        for entry, rows in zip(predictions, indices):
            assert set(entry) == {"logits", "label", "pairs", "score"}
            expected = module.predict_step((x[rows], None), 0)
            for key, tensor in expected.items():
                assert entry[key].dtype == tensor.dtype, key
                assert entry[key].shape == tensor.shape, key
                assert torch.allclose(entry[key], tensor, atol=1e-6), key
    # The CSV keeps one row per sample for the outputs with one value each, the batch of one
    # sample included.
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["index"]) for r in rows] == list(range(23))
    with torch.no_grad():
        labels = module(x).argmax(1).tolist()
    assert [int(r["label"]) for r in rows] == labels
    assert all(r["score"] != "" for r in rows)


def test_a_tensor_and_a_tuple_come_back_as_returned(cluster, tmp_path):
    module = ReturnsTensor()
    x, predictions, indices, _ = _run(cluster, tmp_path, module, "pred-tensor")
    _check_order(indices)
    with torch.no_grad():
        for entry, rows in zip(predictions, indices):
            assert isinstance(entry, torch.Tensor)
            assert torch.allclose(entry, module(x[rows]), atol=1e-6)

    module = ReturnsTuple()
    x, predictions, indices, _ = _run(cluster, tmp_path, module, "pred-tuple")
    with torch.no_grad():
        for entry, rows in zip(predictions, indices):
            assert isinstance(entry, tuple) and len(entry) == 2
            probabilities, labels = module.predict_step((x[rows], None), 0)
            assert torch.allclose(entry[0], probabilities, atol=1e-6)
            assert entry[1].dtype == torch.int32 and torch.equal(entry[1], labels)
