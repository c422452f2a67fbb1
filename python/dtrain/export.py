"""export(): a LightningModule-style nn.Module to the TorchScript file a dtrain job loads
(docs/models.md), checked on an example batch before it is saved, with the usual TorchScript
pitfalls turned into what to change."""

from __future__ import annotations

import inspect
import os
import re
from typing import Any, Dict, List

import grpc

from dtrain.errors import InvalidArgument

STEPS = ("training_step", "validation_step", "test_step", "predict_step")
HOOKS = (
    "on_train_start", "on_train_epoch_start", "on_train_epoch_end", "on_validation_epoch_start",
    "on_validation_epoch_end", "on_test_epoch_start", "on_test_epoch_end",
    "on_predict_epoch_start", "on_predict_epoch_end", "on_train_end", "on_validation_start",
    "on_validation_end", "on_test_start", "on_test_end", "on_predict_start", "on_predict_end",
    "training_step_end",
    "validation_step_end", "test_step_end",
)


def _fail(message: str) -> InvalidArgument:
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, message)


def _own_methods(module: Any, names: tuple) -> List[str]:
    return [n for n in names if callable(getattr(type(module), n, None))
            and getattr(type(module), n).__qualname__.split(".")[0] != "LightningModule"]


def _check_source(module: Any, steps: List[str]) -> None:
    """Pitfalls visible in the source, said before TorchScript's own error would bury them."""
    for name in steps:
        try:
            source = inspect.getsource(getattr(type(module), name))
        except (OSError, TypeError):
            continue
        if re.search(r"\bself\.log(_dict)?\(", source):
            raise _fail(f"{name} calls self.log, which TorchScript cannot compile: return the "
                        f"value in the step's dict instead (return {{'loss': loss, 'acc': acc}}); "
                        "dtrain logs every scalar a step returns (train_acc, val_acc, ...). "
                        "For sync_dist=True, call torch.ops.dtrain.log(name, value, True) "
                        "(import dtrain.ops)")
        signature = inspect.signature(getattr(type(module), name))
        params = [p for p in signature.parameters.values() if p.name != "self"]
        if params and params[0].annotation is inspect.Parameter.empty:
            raise _fail(f"{name}({params[0].name}, ...) has no type for its batch: TorchScript "
                        "takes an unannotated argument for one Tensor. Annotate it as the data's "
                        f"split is, e.g. {params[0].name}: Tuple[torch.Tensor, torch.Tensor] "
                        "(or List[torch.Tensor], Dict[str, torch.Tensor], torch.Tensor)")


def export(module: Any, path: str, example_batch: Any, *, check_steps: bool = True) -> Any:
    """Scripts ``module`` (its Lightning steps and hooks marked for export), runs each step it
    defines once on ``example_batch`` (training_step in train mode, the others in eval mode under
    no_grad; the module's mode and parameters are left as they were), and saves it to ``path``
    with torch.jit.save. Returns the scripted module.

    Raises InvalidArgument saying what to change: no training_step, self.log in a step, an
    untyped batch argument, a step returning None (or not a Tensor / Dict[str, Tensor]), or
    TorchScript's own compile error with the method it is in."""
    import torch

    from dtrain import ops
    ops.register()  # torch.ops.dtrain.*, for modules that call dtrain's collectives
    steps = _own_methods(module, STEPS)
    if "training_step" not in steps:
        raise _fail("the module has no training_step(batch, batch_idx: int); dtrain needs it "
                    "(it returns the loss, or a dict with 'loss')")
    hooks = _own_methods(module, HOOKS)
    _check_source(module, steps)
    # Mark the Lightning methods for export, as @torch.jit.export would, so that a module
    # written for Lightning needs no decorators.
    for name in steps + hooks:
        function = getattr(type(module), name)
        if not getattr(function, "_torchscript_modifier", None):
            torch.jit.export(function)
    try:
        scripted = torch.jit.script(module)
    except Exception as e:  # TorchScript's frontend raises several unrelated types
        text = str(e)
        where = next((s for s in steps + hooks if f"{s}(" in text or f"'{s}'" in text), None)
        hint = ""
        if "Expected a value of type 'Tensor'" in text or "cannot be used as a tuple" in text:
            hint = " (an argument without a type is taken for a Tensor: annotate the batch)"
        raise _fail(f"TorchScript cannot compile the module{' in ' + where if where else ''}"
                    f"{hint}: {text.strip().splitlines()[0] if text.strip() else type(e).__name__}"
                    f"\n{text}") from None
    if check_steps:
        was_training = scripted.training
        state = {k: v.clone() for k, v in scripted.state_dict().items()}
        try:
            for name in steps:
                train = name == "training_step"
                scripted.train(train)
                with torch.set_grad_enabled(train):
                    try:
                        out = getattr(scripted, name)(example_batch, 0)
                    except Exception as e:
                        raise _fail(f"{name} failed on the example batch: {e}") from None
                if out is None:
                    raise _fail(f"{name} returned None: return the loss Tensor or a "
                                "Dict[str, Tensor] (with 'loss' for training_step)")
                if name == "training_step":
                    loss = out.get("loss") if isinstance(out, dict) else out
                    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                        raise _fail("training_step must return the scalar loss or a dict with "
                                    f"'loss' (a one-element Tensor); it returned {type(out).__name__}")
                    if not loss.requires_grad:
                        raise _fail("training_step's loss does not depend on the parameters "
                                    "(requires_grad is False): compute it from the module's output")
                elif not isinstance(out, (torch.Tensor, dict)):
                    raise _fail(f"{name} returned {type(out).__name__}; return a Tensor or a "
                                "Dict[str, Tensor]")
        finally:
            scripted.train(was_training)
            scripted.load_state_dict(state)  # the trial steps may have moved BatchNorm's stats
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    torch.jit.save(scripted, path)
    return scripted


def describe(scripted: Any) -> Dict[str, bool]:
    """Which Lightning methods a scripted module has (what the worker will call)."""
    return {name: hasattr(scripted, name) for name in STEPS + HOOKS}
