"""configure_optimizers() as dtrain.export() records it for the workers.

export() calls the module's configure_optimizers, reads what it returns in each of Lightning's
shapes (an optimizer; a list of one; ([optimizers], [schedulers]); a dict with "optimizer" and
"lr_scheduler", the scheduler alone or in Lightning's config dict with interval, frequency,
monitor and strict) and writes it as optimization.proto's OptimizationRecipe in JSON beside the
TorchScript code. The worker rebuilds the optimizer with its param groups by parameter name, and
replays the schedulers' construction and steps as torch does (worker/model/lr_schedulers.h).
What dtrain cannot rebuild is refused here, naming it.

Imports torch lazily: `import dtrain` stays light."""

import ast
import inspect
import json
import linecache
import textwrap
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc

from dtrain.errors import InvalidArgument

# The JSON file's name in the archive (torch.jit.save's _extra_files).
RECIPE_FILE = "dtrain/optimization.json"

OPTIMIZERS = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad")
SCHEDULERS = ("StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
              "CosineAnnealingWarmRestarts", "OneCycleLR", "LinearLR", "ConstantLR",
              "SequentialLR", "ChainedScheduler", "ReduceLROnPlateau", "LambdaLR")


def _fail(message: str) -> InvalidArgument:
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, f"configure_optimizers: {message}")


def _torch_class(obj: Any, names: Tuple[str, ...], module_prefix: str) -> Optional[str]:
    cls = type(obj)
    if cls.__name__ in names and cls.__module__.startswith(module_prefix):
        return cls.__name__
    return None


class Recorded:
    """What export() adds for the recipe: the JSON, and LambdaLR's functions as methods of the
    scripted module (name -> function taking (self, epoch: int) -> float)."""

    def __init__(self, recipe: Dict[str, Any], methods: Dict[str, Any]):
        self.recipe = recipe
        self.methods = methods

    def json(self) -> str:
        return json.dumps(self.recipe, sort_keys=True)


def record(module: Any, defined: bool) -> Optional[Recorded]:
    """The module's configure_optimizers as a recipe, or None when it defines none (the job then
    uses the spec's optimizer, or sgd). Raises InvalidArgument for what dtrain cannot rebuild."""
    if not defined:
        return None
    if getattr(module, "automatic_optimization", True) is False:
        raise _fail("manual optimization (self.automatic_optimization = False) is not supported: "
                    "dtrain runs the optimizer step itself; remove it and return the optimizer")
    try:
        returned = module.configure_optimizers()
    except Exception as e:  # the user's code, at export, without a Trainer
        hint = ""
        if "trainer" in str(e).lower():
            hint = (" (no Trainer is attached at export: give OneCycleLR total_steps and the "
                    "like as numbers, e.g. epochs * steps_per_epoch)")
        raise _fail(f"it raised {type(e).__name__}: {e}{hint}") from None
    if returned is None:
        return None
    optimizer, configs = _shapes(returned)
    names = {id(p): n for n, p in module.named_parameters()}
    lambdas: Dict[str, Any] = {}
    recipe = {"optimizer": _optimizer(optimizer, names),
              "schedulers": [_config(c, optimizer, lambdas) for c in configs]}
    return Recorded(recipe, lambdas)


def _shapes(returned: Any) -> Tuple[Any, List[Dict[str, Any]]]:
    """Lightning's return shapes -> (the optimizer, [lr_scheduler config dicts])."""
    import torch

    def is_optimizer(x: Any) -> bool:
        return isinstance(x, torch.optim.Optimizer)

    def one(optimizers: List[Any]) -> Any:
        if len(optimizers) != 1:
            raise _fail(f"returned {len(optimizers)} optimizers; dtrain trains with one "
                        "(several optimizers need manual optimization, which dtrain does not run)")
        if not is_optimizer(optimizers[0]):
            raise _fail(f"returned {type(optimizers[0]).__name__} where an optimizer belongs")
        return optimizers[0]

    def configs(schedulers: Any) -> List[Dict[str, Any]]:
        if schedulers is None:
            return []
        items = list(schedulers) if isinstance(schedulers, (list, tuple)) else [schedulers]
        return [dict(s) if isinstance(s, dict) else {"scheduler": s} for s in items]

    if is_optimizer(returned):
        return returned, []
    if isinstance(returned, dict):
        if "optimizer" not in returned:
            raise _fail("returned a dict without 'optimizer'")
        return one([returned["optimizer"]]), configs(returned.get("lr_scheduler"))
    if isinstance(returned, (list, tuple)):
        items = list(returned)
        if len(items) == 2 and isinstance(items[0], (list, tuple)):
            return one(list(items[0])), configs(items[1])
        if items and all(isinstance(x, dict) for x in items):
            if len(items) != 1:
                raise _fail(f"returned {len(items)} optimizer dicts; dtrain trains with one")
            return _shapes(items[0])
        return one(items), []
    raise _fail(f"returned {type(returned).__name__}; return an optimizer, a list, or a dict with "
                "'optimizer' and 'lr_scheduler' (Lightning's shapes)")


def _optimizer(optimizer: Any, names: Dict[int, str]) -> Dict[str, Any]:
    kind = _torch_class(optimizer, OPTIMIZERS, "torch.optim")
    if kind is None:
        raise _fail(f"optimizer {type(optimizer).__name__} is not supported; use "
                    f"{', '.join(OPTIMIZERS[:-1])} or {OPTIMIZERS[-1]} from torch.optim")
    groups = []
    for i, g in enumerate(optimizer.param_groups):
        if g.get("maximize"):
            raise _fail(f"{kind} with maximize=True is not supported; negate the loss instead")
        params = []
        for p in g["params"]:
            if id(p) not in names:
                raise _fail(f"param group {i} holds a tensor that is not a parameter of the module "
                            "(optimize self.parameters() or named ones)")
            params.append(names[id(p)])
        # The rate before any scheduler's first step changed it: torch keeps it as initial_lr.
        group: Dict[str, Any] = {"params": params, "lr": float(g.get("initial_lr", g["lr"])),
                                 "weight_decay": float(g.get("weight_decay", 0.0))}
        if kind == "SGD":
            group.update(momentum=float(g["momentum"]), dampening=float(g["dampening"]),
                         nesterov=bool(g["nesterov"]))
        elif kind in ("Adam", "AdamW"):
            group.update(beta1=float(g["betas"][0]), beta2=float(g["betas"][1]),
                         eps=float(g["eps"]), amsgrad=bool(g["amsgrad"]))
        elif kind == "RMSprop":
            group.update(momentum=float(g["momentum"]), alpha=float(g["alpha"]),
                         eps=float(g["eps"]), centered=bool(g["centered"]))
        else:
            group.update(lr_decay=float(g["lr_decay"]), eps=float(g["eps"]),
                         initial_accumulator_value=float(g["initial_accumulator_value"]))
        groups.append(group)
    return {"kind": kind, "groups": groups}


def _config(config: Dict[str, Any], optimizer: Any, lambdas: Dict[str, Any]) -> Dict[str, Any]:
    if "scheduler" not in config:
        raise _fail("an lr_scheduler dict has no 'scheduler'")
    unknown = set(config) - {"scheduler", "interval", "frequency", "monitor", "strict", "name",
                             "reduce_on_plateau", "opt_idx"}
    if unknown:
        raise _fail(f"lr_scheduler dict key(s) {', '.join(sorted(unknown))} are not Lightning's")
    interval = config.get("interval", "epoch")
    if interval not in ("step", "epoch"):
        raise _fail(f"lr_scheduler interval must be 'step' or 'epoch', got {interval!r}")
    frequency = config.get("frequency", 1)
    if not isinstance(frequency, int) or frequency < 1:
        raise _fail(f"lr_scheduler frequency must be an int >= 1, got {frequency!r}")
    out = _scheduler(config["scheduler"], optimizer, lambdas)
    out.update(interval=interval, frequency=frequency, strict=bool(config.get("strict", True)))
    if out["kind"] == "ReduceLROnPlateau":
        monitor = config.get("monitor")
        if not monitor:
            raise _fail("ReduceLROnPlateau needs a monitor: return {'optimizer': ..., "
                        "'lr_scheduler': {'scheduler': ..., 'monitor': 'val_loss'}}")
        if interval != "epoch":
            raise _fail("ReduceLROnPlateau with interval 'step' is not supported; use 'epoch' "
                        "(it steps after each validation)")
        out["monitor"] = monitor
    return out


def _scheduler(s: Any, optimizer: Any, lambdas: Dict[str, Any]) -> Dict[str, Any]:
    kind = _torch_class(s, SCHEDULERS, "torch.optim")
    if kind is None:
        raise _fail(f"lr scheduler {type(s).__name__} is not supported; use one of "
                    f"{', '.join(SCHEDULERS)} from torch.optim.lr_scheduler")
    if getattr(s, "optimizer", optimizer) is not optimizer:
        raise _fail(f"{kind} belongs to another optimizer than the one returned")
    groups = optimizer.param_groups
    out: Dict[str, Any] = {"kind": kind}
    if kind == "StepLR":
        out.update(step_size=int(s.step_size), gamma=float(s.gamma))
    elif kind == "MultiStepLR":
        out.update(milestones=sorted(int(m) for m in s.milestones.elements()), gamma=float(s.gamma))
    elif kind == "ExponentialLR":
        out.update(gamma=float(s.gamma))
    elif kind == "CosineAnnealingLR":
        out.update(t_max=float(s.T_max), eta_min=float(s.eta_min))
    elif kind == "CosineAnnealingWarmRestarts":
        out.update(t_0=int(s.T_0), t_mult=int(s.T_mult), eta_min=float(s.eta_min))
    elif kind == "LinearLR":
        out.update(start_factor=float(s.start_factor), end_factor=float(s.end_factor),
                   total_iters=int(s.total_iters))
    elif kind == "ConstantLR":
        out.update(factor=float(s.factor), total_iters=int(s.total_iters))
    elif kind == "OneCycleLR":
        phases = s._schedule_phases
        out.update(total_steps=int(s.total_steps),
                   pct_start=(float(phases[0]["end_step"]) + 1) / s.total_steps,
                   anneal_strategy="linear" if "linear" in s.anneal_func.__name__ else "cos",
                   cycle_momentum=bool(s.cycle_momentum), three_phase=len(phases) == 3,
                   max_lr=[float(g["max_lr"]) for g in groups],
                   initial_lr=[float(g["initial_lr"]) for g in groups],
                   min_lr=[float(g["min_lr"]) for g in groups],
                   div_factor=float(groups[0]["max_lr"] / groups[0]["initial_lr"]),
                   final_div_factor=float(groups[0]["initial_lr"] / groups[0]["min_lr"]))
        if s.cycle_momentum:
            out.update(base_momentum=[float(g["base_momentum"]) for g in groups],
                       max_momentum=[float(g["max_momentum"]) for g in groups])
    elif kind in ("SequentialLR", "ChainedScheduler"):
        out["schedulers"] = [_scheduler(c, optimizer, lambdas) for c in s._schedulers]
        if kind == "SequentialLR":
            out["milestones"] = [int(m) for m in s._milestones]
    elif kind == "ReduceLROnPlateau":
        out.update(mode=s.mode, factor=float(s.factor), patience=int(s.patience),
                   threshold=float(s.threshold), threshold_mode=s.threshold_mode,
                   cooldown=int(s.cooldown), min_lr=[float(x) for x in s.min_lrs],
                   eps=float(s.eps))
    elif kind == "LambdaLR":
        out["lr_lambda"] = [_lambda_method(fn, lambdas) for fn in s.lr_lambdas]
    return out


def _lambda_method(fn: Callable, lambdas: Dict[str, Any]) -> str:
    """LambdaLR's function as an exported method of the scripted module: its source compiled
    with `epoch: int`, its closure's values as globals, checked against the function."""
    import torch

    for name, made in lambdas.items():
        if getattr(made, "__dtrain_source__", None) is fn:
            return name
    if not inspect.isfunction(fn):
        raise _fail(f"LambdaLR's lr_lambda {fn!r} is not a function TorchScript can compile; "
                    "write it as a def or a lambda of the epoch")
    code = fn.__code__
    if code.co_argcount != 1:
        raise _fail(f"LambdaLR's lr_lambda at {code.co_filename}:{code.co_firstlineno} takes "
                    f"{code.co_argcount} arguments; it takes the epoch")
    arg = code.co_varnames[0]
    try:
        source = _function_source(fn)
    except (OSError, SyntaxError, ValueError) as e:
        raise _fail(f"cannot read LambdaLR's lr_lambda at {code.co_filename}:"
                    f"{code.co_firstlineno} ({e}); write it as a def in a file") from None
    index = len(lambdas)
    helper = f"dtrain_lr_lambda_fn_{index}"
    method = f"dtrain_lr_lambda_{index}"
    if fn.__name__ == "<lambda>":
        text = f"def {helper}({arg}: int):\n    return {source}\n"
    else:
        text = _retyped_def(source, fn.__name__, helper)
    namespace = dict(fn.__globals__)
    for var, cell in zip(code.co_freevars, fn.__closure__ or ()):
        namespace[var] = cell.cell_contents
    # TorchScript reads no Python numbers from globals or closures: they become literals.
    text = _numbers_inlined(text, namespace, arg)
    filename = f"<dtrain LambdaLR {code.co_filename}:{code.co_firstlineno}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    try:
        exec(compile(text, filename, "exec"), namespace)  # the user's own code, retyped
        scripted = torch.jit.script(namespace[helper])
    except Exception as e:
        raise _fail(f"LambdaLR's lr_lambda at {code.co_filename}:{code.co_firstlineno} cannot be "
                    f"compiled by TorchScript ({_first_line(e)}); "
                    "write it with ints, floats and math/torch calls only") from None
    for epoch in (0, 1, 2, 7, 50):
        want, got = float(fn(epoch)), float(scripted(epoch))
        if abs(want - got) > 1e-12 * max(1.0, abs(want)):
            raise _fail(f"LambdaLR's lr_lambda at {code.co_filename}:{code.co_firstlineno} gives "
                        f"{got} for epoch {epoch} once compiled, {want} in Python (integer "
                        "division?); write it with explicit floats")
    space = {helper: scripted, "torch": torch, "__name__": fn.__module__}
    wrapper = f"def {method}(self, epoch: int) -> float:\n    return float({helper}(epoch))\n"
    wrapper_file = f"<dtrain {method}>"
    # TorchScript reads a method's source through linecache.
    linecache.cache[wrapper_file] = (len(wrapper), None, wrapper.splitlines(True), wrapper_file)
    exec(compile(wrapper, wrapper_file, "exec"), space)
    made = torch.jit.export(space[method])
    made.__dtrain_source__ = fn
    lambdas[method] = made
    return method


def _function_source(fn: Callable) -> str:
    """A lambda's body expression, or a def's whole dedented source."""
    code = fn.__code__
    if fn.__name__ != "<lambda>":
        return textwrap.dedent(inspect.getsource(fn))
    lines = linecache.getlines(code.co_filename)
    if not lines:
        raise OSError("its file cannot be read")
    tree = ast.parse("".join(lines))
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and
             n.lineno == code.co_firstlineno and len(n.args.args) == 1]
    if len(found) != 1:
        raise ValueError(f"{len(found)} one-argument lambdas on that line")
    return ast.unparse(found[0].body)


def _first_line(e: Exception) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


class _Inline(ast.NodeTransformer):
    def __init__(self, values: Dict[str, Any], local: set):
        self.values = values
        self.local = local

    def visit_Name(self, node: ast.Name) -> Any:
        value = self.values.get(node.id)
        if isinstance(node.ctx, ast.Load) and node.id not in self.local and \
                type(value) in (int, float, bool):
            return ast.copy_location(ast.Constant(value), node)
        return node


def _numbers_inlined(text: str, namespace: Dict[str, Any], arg: str) -> str:
    tree = ast.parse(text)
    local = {arg} | {n.id for n in ast.walk(tree)
                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return ast.unparse(_Inline(namespace, local).visit(tree)) + "\n"


def _retyped_def(source: str, name: str, new_name: str) -> str:
    """The def renamed, its first argument typed int, its decorators dropped."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.name = new_name
            node.args.args[0].annotation = ast.Name(id="int", ctx=ast.Load())
            node.decorator_list = []
            return ast.unparse(node) + "\n"
    raise ValueError(f"no def {name} in its source")
