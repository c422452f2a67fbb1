"""A stand-in for pytorch_lightning, for the tests only: Debian packages no Lightning, and the
tests need modules written exactly as Lightning's documentation writes them. It has the part of
LightningModule's surface that such a module touches, with Lightning 2.x's signatures and
class layout: log / log_dict (eager, recording what was logged), the current_epoch /
global_step / device / hparams properties listed in __jit_unused_properties__ as Lightning
lists them, save_hyperparameters() reading __init__'s arguments from the caller's frame, the
base-class hooks and steps as no-ops defined in pytorch_lightning.core.hooks and
pytorch_lightning.core.module. conftest.py puts it on sys.path only when the real package is
missing, so the same tests run against Lightning where it is installed."""

import inspect
from typing import Any, Dict, Optional

import torch

from pytorch_lightning.core.hooks import ModelHooks


class AttributeDict(dict):
    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(key) from e

    def __setattr__(self, key, value):
        self[key] = value


class LightningModule(ModelHooks, torch.nn.Module):
    __jit_unused_properties__ = [
        "example_input_array", "on_gpu", "current_epoch", "global_step", "global_rank",
        "local_rank", "logger", "loggers", "automatic_optimization", "trainer", "fabric",
        "strict_loading", "device", "dtype", "hparams", "hparams_initial",
    ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer = None
        self._jit_is_scripting = False
        self._device = torch.device("cpu")
        self._hparams = AttributeDict()
        self.logged: Dict[str, float] = {}

    @property
    def trainer(self):
        # As Lightning's: TorchScript reads every attribute while scripting, and export()
        # (as Lightning's to_torchscript) sets _jit_is_scripting for that time.
        if self._trainer is None and not self._jit_is_scripting:
            raise RuntimeError("this LightningModule is not attached to a Trainer")
        return self._trainer

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer else 0

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def hparams(self) -> AttributeDict:
        return self._hparams

    def save_hyperparameters(self, *args: Any, ignore: Optional[list] = None) -> None:
        frame = inspect.currentframe().f_back
        init_args = inspect.getargvalues(frame)
        names = [a for a in init_args.args if a != "self"]
        values = {name: init_args.locals[name] for name in names}
        for name in ignore or []:
            values.pop(name, None)
        self._hparams = AttributeDict(values)

    def log(self, name: str, value: Any, prog_bar: bool = False, logger: Optional[bool] = None,
            on_step: Optional[bool] = None, on_epoch: Optional[bool] = None,
            reduce_fx: Any = "mean", enable_graph: bool = False, sync_dist: bool = False,
            sync_dist_group: Optional[Any] = None, add_dataloader_idx: bool = True,
            batch_size: Optional[int] = None, metric_attribute: Optional[str] = None,
            rank_zero_only: bool = False) -> None:
        self.logged[name] = float(value)

    def log_dict(self, dictionary: Dict[str, Any], **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return super().forward(*args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("training_step is not overridden")

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        pass

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        pass

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return self(batch)

    def configure_optimizers(self) -> Any:
        raise NotImplementedError("configure_optimizers is not overridden")

