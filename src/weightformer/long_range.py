"""``--long-range``, a setting of every task: run the long-range design of the recipe's model, keeping its model
settings (``weightformer_tiny`` -> ``weightformer_long_range_tiny``, docs/analysis.md). A design's predictor
is fixed where it is registered (``LONG_RANGE_ARGS`` of models/weightformer_long_range.py) and written into
the run's ``model_kwargs``, so its checkpoints rebuild as it trained. Torch-free: the command line reads it."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from .engine.config import TrainConfig, config_fields, setting
from .engine.errors import ConfigError

__all__ = ["LONG_RANGE_DESIGNS", "LongRangeConfig"]

# A released backbone -> its long-range design: the same size with the double_centered predictor in every block.
LONG_RANGE_DESIGNS = {"weightformer_tiny": "weightformer_long_range_tiny",
                      "weightformer_small": "weightformer_long_range_small"}


@dataclass
class LongRangeConfig(TrainConfig):
    """A task's settings whose model is a timm name, with ``--long-range``; a task whose models are not
    timm backbones overrides :meth:`long_range_designs` and ``LONG_RANGE_HINT``."""

    long_range: bool = setting(False, help="use the long-range design of --model (the double_centered predictor in "
                                           "every block, docs/analysis.md), keeping the recipe's model settings: "
                                           "weightformer_tiny becomes weightformer_long_range_tiny")

    LONG_RANGE_HINT: ClassVar[str] = "weightformer_tiny or weightformer_small"

    @classmethod
    def long_range_designs(cls) -> Mapping[str, str]:
        """Each model that has a long-range design -> that design's name."""
        return LONG_RANGE_DESIGNS

    @classmethod
    def same_model(cls, base: str, other: str) -> bool:
        released = {long: released for released, long in cls.long_range_designs().items()}
        return released.get(base, base) == released.get(other, other)  # a design shares its released model's settings

    @classmethod
    def finish(cls, values: dict[str, Any]) -> dict[str, Any]:
        designs = cls.long_range_designs()
        model = values.get("model", config_fields(cls)["model"].default)
        if values.get("long_range") and model not in designs.values():
            if model not in designs:
                raise ConfigError(f"--long-range: model {model!r} has no long-range design; use it with "
                                  f"{cls.LONG_RANGE_HINT}, or name a model without --long-range")
            model = values["model"] = designs[model]
        if model in designs.values():
            from .models.weightformer_long_range import LONG_RANGE_ARGS

            values["model_kwargs"] = {"linear_predictor": LONG_RANGE_ARGS["linear_predictor"], **values["model_kwargs"]}
        return super().finish(values)

    def check(self) -> None:
        import timm  # here, so that the command line starts without it

        from . import models  # noqa: F401  (registers WeightFormer's models with timm)

        super().check()
        if not timm.is_model(self.model):
            close = difflib.get_close_matches(self.model, timm.list_models(), n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"model {self.model!r} is not a timm model; {hint}list names with "
                              f"timm.list_models('*vit*')")
