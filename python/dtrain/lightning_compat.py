"""What export() puts in place of the parts of a LightningModule that TorchScript cannot compile,
so that a module written in Lightning's idiom scripts unchanged (docs/models.md):

- ``self.log`` / ``self.log_dict`` with Lightning's signature, calling torch.ops.dtrain.log
  (the worker applies Lightning's defaults and names; the coordinator aggregates the epoch);
- ``self.current_epoch``, ``self.global_step`` and ``self.device`` as module attributes that the
  worker keeps current (worker/model/lightning_module.h, SetLoopState and SetDevice);
- ``self.hparams`` as a NamedTuple of what ``save_hyperparameters()`` recorded;
- an unannotated ``batch`` typed from the example batch, and ``batch_idx`` as an int.

Nothing here changes the user's class: export() scripts a subclass made for the occasion.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import linecache
import textwrap
import warnings
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import torch

# Where Lightning defines LightningModule and its base hooks (1.x and 2.x package names).
LIGHTNING_PACKAGES = ("pytorch_lightning", "lightning", "lightning_fabric")


def defined_by_lightning(cls: type, name: str) -> bool:
    """Whether ``cls.name`` is Lightning's own (a base-class hook the user did not override)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            module = getattr(klass, "__module__", "") or ""
            return (module.split(".")[0] in LIGHTNING_PACKAGES
                    or klass.__name__ == "LightningModule")
    return False


class _Scriptable:
    """Mixed in ahead of the user's class: its names win over LightningModule's."""

    # Plain class attributes in place of LightningModule's properties, so that the instance
    # attributes export() sets are what TorchScript sees.
    current_epoch = None
    global_step = None
    device = None
    hparams = None

    def log(self, name: str, value: Union[torch.Tensor, float, int, bool],
            prog_bar: bool = False, logger: Optional[bool] = None,
            on_step: Optional[bool] = None, on_epoch: Optional[bool] = None,
            reduce_fx: str = "mean", enable_graph: bool = False, sync_dist: bool = False,
            sync_dist_group: Optional[str] = None, add_dataloader_idx: bool = True,
            batch_size: Optional[int] = None, metric_attribute: Optional[str] = None,
            rank_zero_only: bool = False) -> None:
        # torch.full, not torch.tensor: TorchScript's torch.tensor(float) passes through float32.
        if isinstance(value, torch.Tensor):
            tensor = value.detach()
        elif isinstance(value, float):
            tensor = torch.full([], value, dtype=torch.float64)
        elif isinstance(value, int):
            tensor = torch.full([], value, dtype=torch.float64)
        else:
            tensor = torch.full([], 1.0 if value else 0.0, dtype=torch.float64)
        torch.ops.dtrain.log(name, tensor, sync_dist, reduce_fx, on_step, on_epoch, batch_size,
                             prog_bar)

    def log_dict(self, dictionary: Dict[str, torch.Tensor], prog_bar: bool = False,
                 logger: Optional[bool] = None, on_step: Optional[bool] = None,
                 on_epoch: Optional[bool] = None, reduce_fx: str = "mean",
                 enable_graph: bool = False, sync_dist: bool = False,
                 sync_dist_group: Optional[str] = None, add_dataloader_idx: bool = True,
                 batch_size: Optional[int] = None, rank_zero_only: bool = False) -> None:
        for name, value in dictionary.items():
            torch.ops.dtrain.log(name, value.detach(), sync_dist, reduce_fx, on_step, on_epoch,
                                 batch_size, prog_bar)


# ---- self.hparams -------------------------------------------------------------------------

_SCALARS = (bool, int, float, str)


def _hparam_type(value: Any) -> Optional[type]:
    """The TorchScript type of a hyperparameter's value, or None when it has none."""
    if isinstance(value, _SCALARS):
        return type(value)
    if isinstance(value, (list, tuple)) and value and all(type(v) is type(value[0])
                                                          and isinstance(v, _SCALARS)
                                                          for v in value):
        return List[type(value[0])]
    return None


def hparams_tuple(hparams: Any) -> Tuple[Optional[Any], List[str]]:
    """save_hyperparameters()' values as a NamedTuple instance (self.hparams.lr in TorchScript),
    and the names left out because TorchScript has no type for their values."""
    if not hparams:
        return None, []
    items = dict(hparams)
    fields, values, left_out = [], [], []
    for key, value in items.items():
        kind = _hparam_type(value)
        if kind is None or not str(key).isidentifier() or str(key).startswith("_"):
            left_out.append(str(key))
            continue
        fields.append((str(key), kind))
        values.append(list(value) if isinstance(value, tuple) else value)
    if not fields:
        return None, left_out
    # TorchScript keeps one NamedTuple type per qualified name in a process: each set of fields
    # gets its own name, so that modules with other hyperparameters export in the same process.
    signature = repr([(name, getattr(kind, "__name__", repr(kind))) for name, kind in fields])
    name = "HParams_" + hashlib.sha1(signature.encode()).hexdigest()[:12]
    HParams = NamedTuple(name, fields)  # noqa: N806 (a type)
    HParams.__module__ = __name__
    return HParams(*values), left_out


def recorded_hparams(module: Any) -> Any:
    """What save_hyperparameters() recorded on ``module`` (Lightning keeps it in _hparams)."""
    recorded = module.__dict__.get("_hparams")
    if recorded is None:
        return {}
    return dict(recorded)


# ---- an untyped batch ---------------------------------------------------------------------

def type_of_batch(batch: Any) -> str:
    """The TorchScript annotation of an example batch, as source text."""
    if isinstance(batch, torch.Tensor):
        return "torch.Tensor"
    if isinstance(batch, dict) and batch and all(isinstance(k, str) for k in batch):
        inner = {type_of_batch(v) for v in batch.values()}
        if len(inner) == 1:
            return f"typing.Dict[str, {inner.pop()}]"
    if isinstance(batch, (list, tuple)) and batch:
        parts = [type_of_batch(v) for v in batch]
        if isinstance(batch, list) and len(set(parts)) == 1:
            return f"typing.List[{parts[0]}]"
        return f"typing.Tuple[{', '.join(parts)}]"
    if isinstance(batch, bool):
        return "bool"
    if isinstance(batch, int):
        return "int"
    if isinstance(batch, float):
        return "float"
    if isinstance(batch, str):
        return "str"
    raise TypeError(f"a batch of {type(batch).__name__} has no TorchScript type")


_typed_sources = 0


def with_typed_arguments(function: Any, types_by_name: Dict[str, str]) -> Any:
    """``function`` with annotations added where its arguments in ``types_by_name`` have none;
    ``function`` itself when none is missing. TorchScript reads types from the source, so the
    copy is compiled from the source with the annotations inserted, under a name of its own in
    linecache that keeps the original file's line numbers for TorchScript's messages."""
    global _typed_sources
    lines, first_line = inspect.getsourcelines(function)
    source = "".join(lines)
    dedented = textwrap.dedent(source)
    tree = ast.parse(dedented)
    definition = next(n for n in ast.walk(tree)
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    edits = []
    for arg in definition.args.args + definition.args.kwonlyargs:
        if arg.annotation is None and arg.arg in types_by_name:
            edits.append((arg.lineno - 1, arg.end_col_offset, f": {types_by_name[arg.arg]}"))
    if not edits:
        return function
    dedented_lines = dedented.splitlines(True)
    for line, column, text in sorted(edits, reverse=True):
        dedented_lines[line] = dedented_lines[line][:column] + text + dedented_lines[line][column:]
    filename = inspect.getsourcefile(function) or "<module>"
    _typed_sources += 1
    virtual = f"{filename} (typed by dtrain.export #{_typed_sources})"
    text = "\n" * (first_line - 1) + "".join(dedented_lines)
    linecache.cache[virtual] = (len(text), None, text.splitlines(True), virtual)
    namespace: Dict[str, Any] = {}
    scope = dict(function.__globals__)
    scope.setdefault("typing", __import__("typing"))
    scope.setdefault("torch", torch)
    exec(compile(text, virtual, "exec"), scope, namespace)  # noqa: S102 (the user's own source)
    typed = namespace[function.__name__]
    typed.__qualname__ = function.__qualname__
    return typed


# ---- the subclass export() scripts --------------------------------------------------------

STEP_ARGUMENTS = ("batch_idx", "dataloader_idx")


def scriptable_class(cls: type, methods: Dict[str, Any],
                     annotations: Optional[Dict[str, Any]] = None) -> type:
    """A subclass of ``cls`` with _Scriptable's names and ``methods`` (typed copies) in place;
    ``annotations`` give attributes their TorchScript types where inference would lose them
    (a NamedTuple is inferred as a plain Tuple)."""
    namespace = dict(methods)
    namespace["__annotations__"] = dict(annotations or {})
    namespace["__module__"] = cls.__module__
    namespace["__qualname__"] = cls.__qualname__
    # What LightningModule lists here stays out of TorchScript; our attributes must not.
    unused = [p for p in getattr(cls, "__jit_unused_properties__", [])
              if p not in ("current_epoch", "global_step", "device", "hparams")]
    namespace["__jit_unused_properties__"] = unused
    return type(cls.__name__, (_Scriptable, cls), namespace)


def loop_state_attributes(module: Any) -> Dict[str, Any]:
    """The attributes the worker keeps current, with their values at export."""
    device = torch.device("cpu")
    for tensor in list(module.parameters()) + list(module.buffers()):
        device = tensor.device
        break
    return {"current_epoch": 0, "global_step": 0, "device": device}


def warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)
