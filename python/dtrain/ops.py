"""torch.ops.dtrain: dtrain's collectives for model code, as a world of one in Python.

A module that calls them from its steps scripts and runs here exactly as it would on one rank;
in a dtrain job the worker runs the same calls on the job's collective plane (its C++ operators
have the same schemas: worker/collectives/collective_ops.h)::

    import dtrain.ops  # defines torch.ops.dtrain.* (dtrain.export does it too)

    def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        z = self.embed(batch[0])
        everyone = torch.ops.dtrain.all_gather(z, True).flatten(0, 1)  # sync_grads
        loss = contrastive(z, everyone)
        torch.ops.dtrain.log("loss_synced", loss, True)                 # sync_dist
        return loss

Importing registers them once; when the process has already loaded dtrain's C++ library
(libdtrain_ops.so through torch.ops.load_library), that registration is kept. Values logged here
are kept in ``logged`` (name -> float), for a look at what a step logs.
"""

from __future__ import annotations

from typing import Dict

import torch

# The schemas, identical to the C++ registration (tests/python/test_ops.py compares them).
SCHEMAS = (
    "all_gather(Tensor tensor, bool sync_grads=False) -> Tensor",
    'all_reduce(Tensor tensor, str op="sum") -> Tensor',
    "broadcast(Tensor tensor, int src=0) -> Tensor",
    'barrier(str name="") -> ()',
    "reduce_boolean_decision(bool decision, bool all=True) -> bool",
    'log(str name, Tensor value, bool sync_dist=False, str reduce_fx="mean", bool? on_step=None, '
    'bool? on_epoch=None, int? batch_size=None, bool prog_bar=False) -> ()',
    "global_rank() -> int",
    "world_size() -> int",
)

REDUCE_OPS = ("sum", "mean", "max", "min", "product")
REDUCE_FX = ("mean", "sum", "max", "min")

logged: Dict[str, float] = {}
_library = None


def _fail(op: str, message: str):
    raise RuntimeError(f"torch.ops.dtrain.{op}: {message}")


def _all_gather(tensor, sync_grads=False):
    return tensor.unsqueeze(0).clone()


def _all_reduce(tensor, op="sum"):
    if op not in REDUCE_OPS:
        _fail("all_reduce", f"unknown reduce op '{op}': use sum, mean, max, min or product")
    return tensor.detach().clone()


def _broadcast(tensor, src=0):
    if src != 0:
        _fail("broadcast", f"src {src} is not a rank of this world of 1")
    return tensor.detach().clone()


def _barrier(name=""):
    return None


def _reduce_boolean_decision(decision, all=True):
    return decision


def _log(name, value, sync_dist=False, reduce_fx="mean", on_step=None, on_epoch=None,
         batch_size=None, prog_bar=False):
    if not name:
        _fail("log", "the name is empty")
    if value.numel() != 1:
        _fail("log", f"'{name}' must be one value (a scalar tensor), got {value.numel()} elements")
    if reduce_fx not in REDUCE_FX:
        _fail("log", f"reduce_fx '{reduce_fx}' for '{name}': use mean, sum, max or min")
    if batch_size is not None and batch_size <= 0:
        _fail("log", f"batch_size for '{name}' must be > 0, got {batch_size}")
    if on_step is False and on_epoch is False:
        _fail("log", f"'{name}' has on_step=False and on_epoch=False: it would never be logged; "
                     "set one of them")
    logged[name] = float(value.detach())


def _global_rank():
    return 0


def _world_size():
    return 1


_KERNELS = {
    "all_gather": _all_gather, "all_reduce": _all_reduce, "broadcast": _broadcast,
    "barrier": _barrier, "reduce_boolean_decision": _reduce_boolean_decision, "log": _log,
    "global_rank": _global_rank, "world_size": _world_size,
}


def registered_schemas() -> Dict[str, str]:
    """Each torch.ops.dtrain operator's schema as this process has it (name -> schema text)."""
    out = {}
    for schema in SCHEMAS:
        name = schema.split("(")[0]
        found = torch._C._jit_get_schemas_for_operator(f"dtrain::{name}")
        if found:
            out[name] = str(found[0])
    return out


def register() -> None:
    """Defines torch.ops.dtrain.* unless this process already has them. Idempotent."""
    global _library
    if _library is not None or torch._C._jit_get_schemas_for_operator("dtrain::all_gather"):
        return
    library = torch.library.Library("dtrain", "DEF")
    for schema in SCHEMAS:
        # CONSERVATIVE: TorchScript must keep every call, in order (a barrier returns nothing,
        # two identical all_gathers are two collectives).
        library.define(schema, alias_analysis="CONSERVATIVE")
        name = schema.split("(")[0]
        library.impl(name, _KERNELS[name], "CompositeImplicitAutograd")
    _library = library


register()
