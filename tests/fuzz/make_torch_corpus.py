"""Writes the seed corpora of the torch.save and checkpoint-restore fuzz targets
(tests/fuzz/corpus/torch_save/ and checkpoint_restore/) with Debian's python3-torch:
files torch.save writes, and the crafted cases the readers must refuse (a storage shorter than
its tensor, strides and offsets out of range, deep nesting, a huge memo index). Run it again
after changing it: python3 tests/fuzz/make_torch_corpus.py"""
import collections
import io
import os
import pickle
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def saved(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def with_pickle(data, edit):
    """The torch.save archive `data` with its data.pkl passed through `edit`."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            body = src.read(info.filename)
            if info.filename.endswith("data.pkl"):
                body = edit(body)
            dst.writestr(info, body)
    return out.getvalue()


def with_record(data, suffix, body):
    """The archive with the record whose name ends in `suffix` replaced by `body`."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info, body if info.filename.endswith(suffix) else src.read(info.filename))
    return out.getvalue()


def write(folder, name, data, prefix=b""):
    path = os.path.join(HERE, "corpus", folder)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, name), "wb") as f:
        f.write(prefix + data)


def torch_save_corpus():
    write("torch_save", "tensors", saved({"x": torch.arange(12.0).reshape(3, 4),
                                           "y": torch.tensor([1, 0, 2]),
                                           "mask": torch.tensor([True, False])}))
    write("torch_save", "one_item", saved({"train": [torch.ones(2)]}))
    write("torch_save", "nested", saved((1, 2.5, "s", [torch.zeros(1, dtype=torch.int8)],
                                         {"a": {"b": torch.eye(2)[:, 1]}})))
    write("torch_save", "ordered", saved(collections.OrderedDict(w=torch.ones(2, 2).t())))
    base = saved({"x": torch.arange(6.0)})
    write("torch_save", "short_storage", with_record(base, "data/0", b"\0" * 8))
    # The tensor's size 6 becomes 600000: it reaches far past its storage.
    write("torch_save", "size_past_storage",
          with_pickle(base, lambda p: p.replace(b"K\x06\x85", b"J\xc0\x27\x09\x00\x85", 1)))
    write("torch_save", "deep", with_pickle(base, lambda p: p[:2] + b"]" * 5000 + p[2:]))
    # LONG_BINPUT with index 2**31: a memo libtorch would size to it.
    write("torch_save", "memo", with_pickle(base, lambda p: p[:2] + b"}r\x00\x00\x00\x80" + p[2:]))


def checkpoint(optimizer_state, extra=None):
    state_dict = collections.OrderedDict(fc_weight=torch.randn(3, 4), fc_bias=torch.randn(3))
    top = {"epoch": 1, "global_step": 7, "pytorch-lightning_version": "1.9.0",
           "state_dict": state_dict, "optimizer_states": [optimizer_state], "lr_schedulers": [],
           "callbacks": {"ModelCheckpoint{'monitor': 'val_loss'}": {"best_model_score":
                                                                    torch.tensor(0.5)}},
           "native_amp_scaling_state": {"scale": 1024.0, "_growth_tracker": 3}}
    top.update(extra or {})
    return saved(top)


def checkpoint_corpus():
    torch.manual_seed(0)
    sgd = {"state": {0: {"momentum_buffer": torch.randn(3, 4)},
                     1: {"momentum_buffer": torch.randn(3)}},
           "param_groups": [{"lr": 0.1, "momentum": 0.9, "dampening": 0, "weight_decay": 0,
                             "nesterov": False, "maximize": False, "foreach": None,
                             "differentiable": False, "params": [0, 1]}]}
    adam = {"state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.randn(3, 4),
                          "exp_avg_sq": torch.rand(3, 4)},
                      1: {"step": torch.tensor(7.0), "exp_avg": torch.randn(3),
                          "exp_avg_sq": torch.rand(3)}},
            "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8,
                              "weight_decay": 0, "amsgrad": False, "maximize": False,
                              "foreach": None, "capturable": False, "differentiable": False,
                              "fused": False, "params": [0, 1]}]}
    # The first byte picks the fuzzer's optimizer: even SGD, odd Adam.
    write("checkpoint_restore", "sgd", checkpoint(sgd), b"\0")
    write("checkpoint_restore", "adam", checkpoint(adam), b"\1")
    write("checkpoint_restore", "adam_state_for_sgd", checkpoint(adam), b"\0")
    write("checkpoint_restore", "no_optimizer", checkpoint(sgd, {"optimizer_states": []}), b"\0")
    wrong = checkpoint(sgd, {"state_dict": {"fc_weight": torch.zeros(4, 3),
                                            "fc_bias": torch.zeros(3)}})
    write("checkpoint_restore", "wrong_shape", wrong, b"\0")
    # Each scheduler the fuzzer builds (the first byte's bits 1-2), its state after a few steps
    # as torch writes it into "lr_schedulers".
    schedulers = [
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=100),
        lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2),
    ]
    names = ["step_lr", "one_cycle", "plateau", "warm_restarts"]
    for pick, (make, name) in enumerate(zip(schedulers, names)):
        params = [torch.zeros(3, 4, requires_grad=True), torch.zeros(3, requires_grad=True)]
        optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        scheduler = make(optimizer)
        for _ in range(3):
            optimizer.step()
            scheduler.step(0.5) if name == "plateau" else scheduler.step()
        state = optimizer.state_dict()
        state["state"] = sgd["state"]
        write("checkpoint_restore", "sched_" + name,
              checkpoint(state, {"lr_schedulers": [scheduler.state_dict()]}), bytes([pick << 1]))


if __name__ == "__main__":
    torch_save_corpus()
    checkpoint_corpus()
