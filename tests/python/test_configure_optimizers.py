"""configure_optimizers as Lightning users write it: export() records it, a dtrain job trains with
it, and for every supported optimizer and scheduler the learning rate of each of 50 steps and
the final parameters equal Python torch's to 1e-6 (a plain loop that steps the schedulers as
Lightning does). The checkpoint holds torch's state_dict layouts, and a run resumed in either
runtime continues as if it had never stopped."""

import math

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.optim import lr_scheduler as S

import dtrain
from dtrain.v1 import jobs_pb2

EPOCHS, STEPS, BATCH = 5, 10, 8  # 50 optimizer steps


def _groups(m, lr, decay, **kw):
    """The common split: no weight decay on biases and norms, each group with its own rate."""
    no_decay = [p for n, p in m.named_parameters() if n.endswith("bias") or n.startswith("norm")]
    decayed = [p for n, p in m.named_parameters() if not (n.endswith("bias") or n.startswith("norm"))]
    return [{"params": decayed, "weight_decay": decay, **kw}, {"params": no_decay, "lr": lr * 2,
                                                                "weight_decay": 0.0}]


def _warmup(step):
    return min(1.0, (step + 1) / WARMUP)


WARMUP = 5


def _case(name, m):
    p = m.parameters()
    if name == "sgd_step":
        o = torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-3)
        return {"optimizer": o, "lr_scheduler": {"scheduler": S.StepLR(o, 7, 0.5), "interval": "step"}}
    if name == "sgd_nesterov_multistep":
        o = torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)
        return [o], [S.MultiStepLR(o, [2, 4], 0.3)]  # Lightning's default interval: epoch
    if name == "adam_exponential":
        o = torch.optim.Adam(p, lr=0.01, amsgrad=True, weight_decay=1e-2)
        return {"optimizer": o, "lr_scheduler": {"scheduler": S.ExponentialLR(o, 0.97),
                                                 "interval": "step"}}
    if name == "adamw_groups_cosine":
        o = torch.optim.AdamW(_groups(m, 0.01, 0.05), lr=0.01, betas=(0.8, 0.99))
        return {"optimizer": o, "lr_scheduler": {"scheduler": S.CosineAnnealingLR(o, 20, 1e-4),
                                                 "interval": "step"}}
    if name == "rmsprop_warm_restarts":
        o = torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, alpha=0.9)
        return {"optimizer": o, "lr_scheduler": {
            "scheduler": S.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2), "interval": "step"}}
    if name == "adagrad_linear":
        o = torch.optim.Adagrad(p, lr=0.1, lr_decay=1e-3, initial_accumulator_value=0.1)
        return {"optimizer": o, "lr_scheduler": {
            "scheduler": S.LinearLR(o, start_factor=0.25, total_iters=10), "interval": "step"}}
    if name == "sgd_onecycle":
        o = torch.optim.SGD(p, lr=0.1, momentum=0.9)
        return {"optimizer": o, "lr_scheduler": {
            "scheduler": S.OneCycleLR(o, max_lr=0.05, total_steps=EPOCHS * STEPS), "interval": "step"}}
    if name == "adamw_groups_onecycle_three_phase":
        o = torch.optim.AdamW(_groups(m, 0.01, 0.01), lr=0.01)
        return {"optimizer": o, "lr_scheduler": {
            "scheduler": S.OneCycleLR(o, max_lr=[0.02, 0.04], epochs=EPOCHS, steps_per_epoch=STEPS,
                                      three_phase=True, anneal_strategy="linear"),
            "interval": "step"}}
    if name == "sgd_constant_every_2":
        o = torch.optim.SGD(p, lr=0.1)
        return {"optimizer": o, "lr_scheduler": {
            "scheduler": S.ConstantLR(o, factor=0.5, total_iters=4), "interval": "step",
            "frequency": 2}}
    if name == "adam_sequential":
        o = torch.optim.Adam(p, lr=0.01)
        warm = S.LinearLR(o, start_factor=0.1, total_iters=5)
        cos = S.CosineAnnealingLR(o, T_max=45)
        return {"optimizer": o, "lr_scheduler": {
            "scheduler": S.SequentialLR(o, [warm, cos], milestones=[5]), "interval": "step"}}
    if name == "sgd_chained":
        o = torch.optim.SGD(p, lr=0.1, momentum=0.5)
        return {"optimizer": o, "lr_scheduler": {"scheduler": S.ChainedScheduler(
            [S.ConstantLR(o, factor=0.5, total_iters=4), S.ExponentialLR(o, 0.95)]),
            "interval": "step"}}
    if name == "rmsprop_plateau":
        o = torch.optim.RMSprop(p, lr=0.01)
        # A threshold no epoch clears: every epoch is bad, so the rate halves after each.
        return {"optimizer": o, "lr_scheduler": {"scheduler": S.ReduceLROnPlateau(
            o, factor=0.5, patience=0, threshold=0.9), "monitor": "val_loss"}}
    if name == "sgd_lambda":
        o = torch.optim.SGD(_groups(m, 0.05, 1e-3), lr=0.05)
        return {"optimizer": o, "lr_scheduler": {
            "scheduler": S.LambdaLR(o, [lambda step: 0.95 ** step, _warmup]), "interval": "step"}}
    if name == "adam_alone":
        return torch.optim.Adam(p, lr=0.01)
    raise KeyError(name)


CASES = ["sgd_step", "sgd_nesterov_multistep", "adam_exponential", "adamw_groups_cosine",
         "rmsprop_warm_restarts", "adagrad_linear", "sgd_onecycle",
         "adamw_groups_onecycle_three_phase", "sgd_constant_every_2", "adam_sequential",
         "sgd_chained", "rmsprop_plateau", "sgd_lambda", "adam_alone"]


class Net(pl.LightningModule):
    def __init__(self, case="adam_alone"):
        super().__init__()
        self.save_hyperparameters()
        self.fc1 = torch.nn.Linear(6, 12)
        self.norm = torch.nn.LayerNorm(12)
        self.fc2 = torch.nn.Linear(12, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def configure_optimizers(self):
        return _case(self.hparams.case, self)


def _data():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(STEPS * BATCH + 40, 6, generator=g)
    y = torch.stack([x[:, 0] * 2 - x[:, 1], x[:, 2].tanh(), x[:, 3] * x[:, 4]], 1)
    return x[:STEPS * BATCH], y[:STEPS * BATCH], x[STEPS * BATCH:], y[STEPS * BATCH:]


_INITIAL = {}


def _model(case):
    if not _INITIAL:
        torch.manual_seed(7)
        _INITIAL.update({k: v.clone() for k, v in Net().state_dict().items()})
    m = Net(case)
    m.load_state_dict(_INITIAL)
    return m


def _configs(returned):
    """Lightning's shapes, as the loop below steps them: (optimizer, [config dicts])."""
    if isinstance(returned, torch.optim.Optimizer):
        return returned, []
    if isinstance(returned, tuple):
        return returned[0][0], [{"scheduler": s} for s in returned[1]]
    c = returned["lr_scheduler"]
    return returned["optimizer"], [c if isinstance(c, dict) else {"scheduler": c}]


def _reference(case, epochs=EPOCHS, start=None):
    """A plain Python loop with Lightning's scheduler stepping: per-step rates and the model,
    optionally resumed from a checkpoint dict (start)."""
    x, y, xv, yv = _data()
    model = _model(case)
    optimizer, configs = _configs(model.configure_optimizers())
    first_epoch = 0
    if start is not None:
        model.load_state_dict(start["state_dict"])
        optimizer.load_state_dict(start["optimizer_states"][0])
        for c, state in zip(configs, start["lr_schedulers"]):
            c["scheduler"].load_state_dict(state)
        first_epoch = start["epoch"] + 1
    rates = []
    for epoch in range(first_epoch, epochs):
        for b in range(STEPS):
            xb, yb = x[b * BATCH:(b + 1) * BATCH], y[b * BATCH:(b + 1) * BATCH]
            optimizer.zero_grad()
            F.mse_loss(model(xb), yb).backward()
            rates.append([g["lr"] for g in optimizer.param_groups])
            optimizer.step()
            for c in configs:
                plateau = isinstance(c["scheduler"], S.ReduceLROnPlateau)
                if c.get("interval", "epoch") == "step" and not plateau and \
                        (b + 1) % c.get("frequency", 1) == 0:
                    c["scheduler"].step()
            for c in configs:
                plateau = isinstance(c["scheduler"], S.ReduceLROnPlateau)
                if b == STEPS - 1 and c.get("interval", "epoch") == "epoch" and not plateau and \
                        (epoch + 1) % c.get("frequency", 1) == 0:
                    c["scheduler"].step()
        with torch.no_grad():
            val = F.mse_loss(model(xv), yv).item()
        for c in configs:
            if isinstance(c["scheduler"], S.ReduceLROnPlateau):
                c["scheduler"].step(val)
    return model, optimizer, configs, rates


def _export(case, tmp_path):
    x, y, xv, yv = _data()
    path = str(tmp_path / f"{case}.pt")
    dtrain.export(_model(case), path, (x[:BATCH], y[:BATCH]))
    torch.save({"train": (x, y), "val": (xv, yv)}, str(tmp_path / "data.pt"))
    return path


def _spec(case, model_path, tmp_path, epochs=EPOCHS, **extra):
    return {"name": case.replace("_", "-"), "model": {"torchscript": model_path},
            "data": {"tensors_file": str(tmp_path / "data.pt"), "batch_size": BATCH,
                     "eval_batch_size": 40, "shuffle": False},
            "trainer": {"max_epochs": epochs, "log_every_n_steps": 1, "batches_per_call": 4},
            "seed_everything": 1, **extra}


def _rate_names(optimizer):
    name = f"lr-{type(optimizer).__name__}"
    groups = len(optimizer.param_groups)
    return [name] if groups == 1 else [f"{name}/pg{i + 1}" for i in range(groups)]


def _max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in b)


def test_export_records_it_and_refuses_what_dtrain_cannot_rebuild(tmp_path):
    x, y, _, _ = _data()
    model = _model("adamw_groups_onecycle_three_phase")
    scripted = dtrain.export(model, str(tmp_path / "m.pt"), (x[:BATCH], y[:BATCH]))
    extra = {"dtrain/optimization.json": ""}
    torch.jit.load(str(tmp_path / "m.pt"), _extra_files=extra)
    import json
    recipe = json.loads(extra["dtrain/optimization.json"])
    assert recipe["optimizer"]["kind"] == "AdamW"
    assert [len(g["params"]) for g in recipe["optimizer"]["groups"]] == [2, 4]
    assert recipe["optimizer"]["groups"][1]["params"] == ["fc1.bias", "norm.weight", "norm.bias",
                                                          "fc2.bias"]
    [one_cycle] = recipe["schedulers"]
    assert one_cycle["kind"] == "OneCycleLR" and one_cycle["interval"] == "step"
    assert one_cycle["three_phase"] and one_cycle["total_steps"] == 50
    assert scripted.training_step.code

    class Lbfgs(Net):
        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters())

    class TwoOptimizers(Net):
        def configure_optimizers(self):
            return [torch.optim.SGD(self.fc1.parameters(), lr=0.1),
                    torch.optim.SGD(self.fc2.parameters(), lr=0.1)], []

    class Cyclic(Net):
        def configure_optimizers(self):
            o = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            return [o], [S.CyclicLR(o, 0.01, 0.1)]

    class Manual(Net):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

    class NeedsTrainer(Net):
        def configure_optimizers(self):
            o = torch.optim.SGD(self.parameters(), lr=0.1)
            steps = self.trainer.estimated_stepping_batches
            return [o], [S.OneCycleLR(o, 0.1, total_steps=steps)]

    class PlateauWithoutMonitor(Net):
        def configure_optimizers(self):
            o = torch.optim.SGD(self.parameters(), lr=0.1)
            return [o], [S.ReduceLROnPlateau(o)]

    for cls, words in [(Lbfgs, "LBFGS is not supported"), (TwoOptimizers, "2 optimizers"),
                       (Cyclic, "CyclicLR is not supported"), (Manual, "manual optimization"),
                       (NeedsTrainer, "no Trainer is attached at export"),
                       (PlateauWithoutMonitor, "needs a monitor")]:
        with pytest.raises(dtrain.InvalidArgument) as bad:
            dtrain.export(cls(), str(tmp_path / "bad.pt"), (x[:BATCH], y[:BATCH]))
        assert "configure_optimizers" in bad.value.message and words in bad.value.message, \
            (cls.__name__, bad.value.message)


def test_every_optimizer_and_scheduler_equals_torch_over_50_steps(cluster, tmp_path):
    client = dtrain.Client(cluster.address)
    jobs = {}
    for case in CASES:
        jobs[case] = client.submit(_spec(case, _export(case, tmp_path), tmp_path))
    for case, job in jobs.items():
        status = job.wait(timeout=300)
        assert status.state == jobs_pb2.SUCCEEDED, (case, status.reason)
        model, optimizer, configs, rates = _reference(case)
        assert len(rates) == 50
        points = {}
        for p in job.metrics():
            points.setdefault(p["name"], {})[p["step"]] = p["value"]
        for g, name in enumerate(_rate_names(optimizer)):
            got = [points.get(name, {}).get(step) for step in range(1, 51)]
            want = [r[g] for r in rates]
            assert None not in got, (case, name, sorted(points))
            worst = max(abs(a - b) for a, b in zip(got, want))
            assert worst <= 1e-6 * max(1.0, max(want)), (case, name, worst, got[:12], want[:12])
        assert len({round(r[0], 12) for r in rates}) > 1 or not configs, \
            f"{case}: the schedule changed the rate"
        [last] = job.download("last", str(tmp_path / f"ckpt-{case}"))
        checkpoint = torch.load(last, map_location="cpu")
        diff = _max_diff(checkpoint["state_dict"], model.state_dict())
        moved = _max_diff(model.state_dict(), _INITIAL)
        assert moved > 1e-3, case
        assert diff <= 1e-6, f"{case}: parameters differ from torch's by {diff}"
        # torch's state_dict layouts: the same keys, per parameter and per group.
        ours, theirs = checkpoint["optimizer_states"][0], optimizer.state_dict()
        assert sorted(ours["state"]) == sorted(theirs["state"]), case
        assert set(ours["state"][0]) == set(theirs["state"][0]), case
        for a, b in zip(ours["param_groups"], theirs["param_groups"]):
            assert a["params"] == b["params"], case
            missing = set(b) - set(a) - {"fused"}
            assert not missing, (case, missing)
        assert len(checkpoint["lr_schedulers"]) == len(configs), case
        for state, c in zip(checkpoint["lr_schedulers"], configs):
            want_keys = set(c["scheduler"].state_dict()) - {"anneal_func"}
            assert want_keys <= set(state), (case, want_keys - set(state))
        # The job's log says what it trains with.
        assert "configure_optimizers" in "\n".join(job.logs()), case


@pytest.mark.parametrize("case", ["adamw_groups_onecycle_three_phase", "rmsprop_plateau",
                                  "adam_sequential"])
def test_resuming_continues_identically_in_either_runtime(cluster, tmp_path, case):
    client = dtrain.Client(cluster.address)
    model_path = _export(case, tmp_path)
    full_model, _, _, full_rates = _reference(case)
    # dtrain stops after 3 epochs; Python torch continues from its checkpoint.
    job = client.submit(_spec(case, model_path, tmp_path, epochs=3))
    status = job.wait(timeout=300)
    assert status.state == jobs_pb2.SUCCEEDED, status.reason
    [last] = job.download("last", str(tmp_path / "dtrain-3"))
    checkpoint = torch.load(last, map_location="cpu")
    assert checkpoint["epoch"] == 2 and checkpoint["global_step"] == 30
    resumed, _, _, rates = _reference(case, start=checkpoint)
    assert max(abs(a - b) for ra, rb in zip(rates, full_rates[30:]) for a, b in zip(ra, rb)) <= 1e-6
    assert _max_diff(resumed.state_dict(), full_model.state_dict()) <= 1e-6
    # Python torch stops after 3 epochs and writes Lightning's layout; dtrain continues from it.
    model, optimizer, configs, _ = _reference(case, epochs=3)
    torch.save({"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()],
                "lr_schedulers": [c["scheduler"].state_dict() for c in configs],
                "epoch": 2, "global_step": 30, "pytorch-lightning_version": "1.9.0"},
               str(tmp_path / "python-3.ckpt"))
    job = client.submit(_spec(case, model_path, tmp_path, ckpt_path=str(tmp_path / "python-3.ckpt")))
    status = job.wait(timeout=300)
    assert status.state == jobs_pb2.SUCCEEDED, status.reason
    [last] = job.download("last", str(tmp_path / "dtrain-5"))
    final = torch.load(last, map_location="cpu")
    assert final["global_step"] == 50
    diff = _max_diff(final["state_dict"], full_model.state_dict())
    assert diff <= 1e-6, f"resumed from Python's checkpoint: {diff}"
    points = {}
    for p in job.metrics():
        points.setdefault(p["name"], {})[p["step"]] = p["value"]
    name = _rate_names(optimizer)[0]
    for step in range(31, 51):
        assert math.isclose(points[name][step], full_rates[step - 1][0], rel_tol=1e-6, abs_tol=1e-9)


def test_early_stopping_state_travels_in_the_checkpoint(cluster, tmp_path):
    """EarlyStopping's state is in the checkpoint under Lightning's key and layout, and a run
    resumed from a checkpoint resumes it: here one whose best_score no epoch can beat and whose
    wait_count is one short of patience, so the first validation stops the resumed run."""
    client = dtrain.Client(cluster.address)
    model_path = _export("adam_alone", tmp_path)
    key = "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"
    stopping = {"early_stopping": {"monitor": "val_loss", "patience": 2}}
    job = client.submit(_spec("adam_alone", model_path, tmp_path, epochs=3, **stopping))
    status = job.wait(timeout=300)
    assert status.state == jobs_pb2.SUCCEEDED, status.reason
    [last] = job.download("last", str(tmp_path / "es"))
    checkpoint = torch.load(last, map_location="cpu")
    state = checkpoint["callbacks"][key]
    val = [p["value"] for p in job.metrics() if p["name"] == "val_loss"]
    assert len(val) == 3
    assert isinstance(state["best_score"], torch.Tensor) and state["best_score"].dim() == 0
    assert math.isclose(state["best_score"].item(), min(val), rel_tol=1e-6)
    assert state["patience"] == 2 and state["stopped_epoch"] == 0
    assert state["wait_count"] == len(val) - 1 - val.index(min(val))
    checkpoint["callbacks"][key].update(best_score=torch.tensor(-1.0), wait_count=1)
    torch.save(checkpoint, str(tmp_path / "waiting.ckpt"))
    job = client.submit(_spec("adam_alone", model_path, tmp_path, epochs=8,
                              ckpt_path=str(tmp_path / "waiting.ckpt"), **stopping))
    status = job.wait(timeout=300)
    assert status.state == jobs_pb2.SUCCEEDED, status.reason
    assert "early stopping: val_loss did not improve" in "\n".join(job.logs())
    [last] = job.download("last", str(tmp_path / "es2"))
    resumed = torch.load(last, map_location="cpu")
    assert resumed["global_step"] == 4 * STEPS, "stopped after the first resumed epoch"
    assert resumed["callbacks"][key]["wait_count"] == 2
    assert resumed["callbacks"][key]["stopped_epoch"] == 3


def test_the_specs_optimizer_overrides_it_and_each_steps_rate_is_logged(cluster, tmp_path):
    """A spec that names an optimizer and a schedule overrides configure_optimizers (the log
    says so), and lr-SGD has each step's own rate: 0.1 halved every 3 steps."""
    client = dtrain.Client(cluster.address)
    model_path = _export("adamw_groups_cosine", tmp_path)
    job = client.submit(_spec("adamw_groups_cosine", model_path, tmp_path, epochs=1,
                              optimizer={"name": "sgd", "lr": 0.1},
                              lr_scheduler={"name": "step", "step_size": 3, "gamma": 0.5}))
    status = job.wait(timeout=300)
    assert status.state == jobs_pb2.SUCCEEDED, status.reason
    assert "it overrides the model's configure_optimizers" in "\n".join(job.logs())
    rates = {p["step"]: p["value"] for p in job.metrics() if p["name"] == "lr-SGD"}
    assert sorted(rates) == list(range(1, STEPS + 1))
    for step, lr in rates.items():
        assert math.isclose(lr, 0.1 * 0.5 ** ((step - 1) // 3), rel_tol=1e-12), (step, lr)
    assert not any(p["name"].startswith("lr-AdamW") for p in job.metrics())
