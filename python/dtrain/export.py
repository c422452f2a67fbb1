"""export(): a LightningModule-style nn.Module to the TorchScript file a dtrain job loads
(docs/models.md), checked on an example batch before it is saved, with the usual TorchScript
pitfalls turned into what to change."""

from __future__ import annotations

import inspect
import os
import re
import types
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


def _compat() -> Any:
    """dtrain.lightning_compat, imported on first use: `import dtrain` must not import torch."""
    from dtrain import lightning_compat
    return lightning_compat


def _fail(message: str) -> InvalidArgument:
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, message)


def _own_methods(module: Any, names: tuple) -> List[str]:
    """The names among ``names`` that the module's own class defines (not Lightning's bases)."""
    cls = type(module)
    return [n for n in names if callable(getattr(cls, n, None))
            and not _compat().defined_by_lightning(cls, n)]


# Constructs TorchScript cannot compile, each with the rewrite that works in dtrain.
_UNSUPPORTED = (
    (r"\bself\.trainer\b", "self.trainer",
     "read self.current_epoch or self.global_step, or call torch.ops.dtrain.world_size() / "
     "global_rank() (import dtrain.ops)"),
    (r"\bself\.(global_rank|local_rank)\b", "self.global_rank",
     "call torch.ops.dtrain.global_rank()"),
    (r"\bself\.print\(", "self.print(...)", "use print(...)"),
    (r"\bself\.hparams\[", "self.hparams[...]", "read it as an attribute: self.hparams.NAME"),
    (r"\bself\.all_gather\(", "self.all_gather(...)",
     "call torch.ops.dtrain.all_gather(tensor, sync_grads) (import dtrain.ops)"),
    (r"\bself\.loggers?\b", "self.logger",
     "log with self.log / self.log_dict: dtrain writes metrics.csv and the dashboard"),
    (r"\bself\.(optimizers|lr_schedulers|manual_backward|toggle_optimizer)\(",
     "manual optimization",
     "dtrain runs automatic optimization only: return the loss from training_step and let "
     "configure_optimizers (or the spec's optimizer) step"),
    (r"\breduce_fx\s*=\s*(torch|np|numpy)\.", "reduce_fx=<function>",
     'name it as a string: reduce_fx="mean" (or "sum", "max", "min")'),
)


def _check_source(module: Any, methods: List[str]) -> None:
    """Constructs TorchScript cannot compile, named at their file:line with the rewrite, before
    TorchScript's own error would bury them."""
    cls = type(module)
    for name in methods:
        function = getattr(cls, name)
        try:
            lines, first = inspect.getsourcelines(function)
            filename = inspect.getsourcefile(function) or "<unknown>"
        except (OSError, TypeError):
            continue
        for offset, line in enumerate(lines):
            code = line.split("#", 1)[0]
            for pattern, construct, rewrite in _UNSUPPORTED:
                if re.search(pattern, code):
                    raise _fail(f"{filename}:{first + offset}: {name} uses {construct}, which "
                                f"TorchScript cannot compile: {rewrite}\n    {line.strip()}")


def _hooks_dtrain_can_call(module: Any, hooks: List[str]) -> List[str]:
    """The hooks called with no arguments, as the worker calls them. Lightning 1.x's
    on_predict_epoch_end(self, results) and on_train_epoch_end(self, outputs) take the epoch's
    outputs, which dtrain keeps on the coordinator: they are left out, and said so."""
    callable_hooks = []
    for name in hooks:
        parameters = list(inspect.signature(getattr(type(module), name)).parameters.values())[1:]
        required = [p.name for p in parameters if p.default is inspect.Parameter.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if required:
            _compat().warn(f"{name}({', '.join(required)}) is Lightning 1.x's signature with "
                           "the epoch's outputs, which dtrain does not pass: it is not exported "
                           "(give its arguments defaults, or drop them, to have it run)")
            continue
        callable_hooks.append(name)
    return callable_hooks


def _typed_methods(module: Any, steps: List[str], hooks: List[str],
                   example_batch: Any) -> Dict[str, Any]:
    """Each step and hook as a function marked for export, its batch typed from the example
    batch and batch_idx / dataloader_idx as int where the source gives no type."""
    import torch

    cls = type(module)
    batch_type = None
    methods = {}
    for name in steps + hooks:
        function = getattr(cls, name)
        types_by_name = {}
        if name in steps:
            parameters = [p for p in inspect.signature(function).parameters.values()
                          if p.name != "self"]
            if parameters and parameters[0].annotation is inspect.Parameter.empty:
                if batch_type is None:
                    try:
                        batch_type = _compat().type_of_batch(example_batch)
                    except TypeError as e:
                        raise _fail(f"{name}({parameters[0].name}, ...) has no type for its "
                                    f"batch, and the example batch gives none ({e}): annotate "
                                    "it, e.g. Tuple[torch.Tensor, torch.Tensor]") from None
                types_by_name[parameters[0].name] = batch_type
            for p in parameters[1:]:
                if p.name in _compat().STEP_ARGUMENTS:
                    types_by_name[p.name] = "int"
        try:
            typed = _compat().with_typed_arguments(function, types_by_name)
        except (OSError, TypeError, SyntaxError):
            typed = function
        if typed is function:
            # A copy, so that marking it for export leaves the user's class as it was.
            typed = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                                       function.__defaults__, function.__closure__)
            typed.__qualname__ = function.__qualname__
            typed.__kwdefaults__ = function.__kwdefaults__
            typed.__annotations__ = dict(getattr(function, "__annotations__", {}))
        methods[name] = torch.jit.export(typed)
    return methods


def _compile_error(text: str, names: List[str]) -> InvalidArgument:
    """TorchScript's error as file:line, the method and its first line, then the full text."""
    where = ""
    found = re.search(r'File "(.*?)(?: \(typed by dtrain\.export #\d+\))?", line (\d+)', text)
    if found:
        where = f"{found.group(1)}:{found.group(2)}: "
    method = next((n for n in names if f"def {n}(" in text or f"'{n}'" in text), None)
    hint = ""
    if "Expected a value of type 'Tensor'" in text or "cannot be used as a tuple" in text:
        hint = " (an argument without a type is taken for a Tensor: annotate it)"
    elif "hparams" in text and ("NoneType" in text or "has no attribute" in text):
        hint = (" (self.hparams holds what save_hyperparameters() recorded, with bool, int, "
                "float, str or lists of them: call it in __init__)")
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return _fail(f"{where}TorchScript cannot compile the module"
                 f"{' in ' + method if method else ''}{hint}: {first}\n{text}")


def export(module: Any, path: str, example_batch: Any, *, check_steps: bool = True) -> Any:
    """Scripts ``module`` (its Lightning steps and hooks marked for export), runs each step it
    defines once on ``example_batch`` (training_step in train mode, the others in eval mode under
    no_grad; the module's mode and parameters are left as they were), and saves it to ``path``
    with torch.jit.save. Returns the scripted module.

    A module written for Lightning goes as it is (lightning_compat.py): self.log and
    self.log_dict, self.current_epoch / global_step / device / hparams, an unannotated batch
    (typed from ``example_batch``) and batch_idx. The user's class is left unchanged: a subclass
    made for the occasion is what is scripted.

    Raises InvalidArgument saying what to change: no training_step, a construct TorchScript
    cannot compile (file:line, the construct and its rewrite), a step returning what dtrain
    cannot read, or TorchScript's own compile error at its file:line.

    configure_optimizers, when the module defines it, is called and recorded in the file
    (optimization.py): the job then trains with its optimizer, param groups and schedulers,
    unless the job spec names an optimizer of its own."""
    import torch

    from dtrain import ops
    ops.register()  # torch.ops.dtrain.*, for modules that call dtrain's collectives
    steps = _own_methods(module, STEPS)
    if "training_step" not in steps:
        raise _fail("the module has no training_step(batch, batch_idx: int); dtrain needs it "
                    "(it returns the loss, or a dict with 'loss')")
    hooks = _hooks_dtrain_can_call(module, _own_methods(module, HOOKS))
    _check_source(module, steps + hooks)
    from dtrain import optimization
    recorded = optimization.record(
        module, bool(_own_methods(module, ("configure_optimizers",))))
    methods = _typed_methods(module, steps, hooks, example_batch)
    if recorded is not None:
        methods.update(recorded.methods)
    scripted = _script(module, methods, steps + hooks)
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
                if out is None and name in ("validation_step", "test_step"):
                    continue  # Lightning's evaluation steps may only self.log
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
                elif name == "predict_step" and isinstance(out, (list, tuple)):
                    # Kept as returned in predictions.pt (worker: a list or tuple of tensors).
                    if not all(isinstance(item, torch.Tensor) for item in out):
                        raise _fail(f"predict_step returned a {type(out).__name__} holding "
                                    "something other than tensors; return tensors in it")
                elif not isinstance(out, (torch.Tensor, dict)):
                    also = ", or (predict_step) a list or tuple of tensors" \
                        if name == "predict_step" else ""
                    raise _fail(f"{name} returned {type(out).__name__}; return a Tensor or a "
                                f"Dict[str, Tensor]{also}")
        finally:
            scripted.train(was_training)
            scripted.load_state_dict(state)  # the trial steps may have moved BatchNorm's stats
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    extra = {optimization.RECIPE_FILE: recorded.json()} if recorded is not None else {}
    torch.jit.save(scripted, path, _extra_files=extra)
    return scripted


def _script(module: Any, methods: Dict[str, Any], names: List[str]) -> Any:
    """torch.jit.script of ``module`` as an instance of the scriptable subclass, with the
    attributes the worker keeps current; the module is given back its class and attributes."""
    import torch

    cls = type(module)
    added = _compat().loop_state_attributes(module)
    hparams, left_out = _compat().hparams_tuple(_compat().recorded_hparams(module))
    if hparams is not None:
        added["hparams"] = hparams
    if left_out:
        _compat().warn(f"self.hparams leaves out {', '.join(left_out)}: TorchScript has no type "
                       "for their values (bool, int, float, str and lists of one of them have one)")
    # Lightning's own flag for scripting (LightningModule.to_torchscript sets it): its trainer
    # property raises while no Trainer is attached, and TorchScript reads every attribute.
    added["_jit_is_scripting"] = True
    shadowed = {name: module.__dict__[name] for name in added if name in module.__dict__}
    annotations = {"hparams": type(hparams)} if hparams is not None else {}
    module.__class__ = _compat().scriptable_class(cls, methods, annotations)
    try:
        for name, value in added.items():
            object.__setattr__(module, name, value)
        try:
            return torch.jit.script(module)
        except Exception as e:  # TorchScript's frontend raises several unrelated types
            raise _compile_error(str(e) or type(e).__name__, names) from None
    finally:
        module.__class__ = cls
        for name in added:
            module.__dict__.pop(name, None)
        module.__dict__.update(shadowed)


def describe(scripted: Any) -> Dict[str, bool]:
    """Which Lightning methods a scripted module has (what the worker will call)."""
    return {name: hasattr(scripted, name) for name in STEPS + HOOKS}
