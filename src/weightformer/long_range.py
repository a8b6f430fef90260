"""``--long-range``, a setting of every task: run the long-range design of the recipe's model
(``weightformer_tiny`` -> ``weightformer_long_range_tiny``, docs/analysis.md), keeping its model settings.

A long-range design is a model name; its linear predictor is fixed where it is registered
(:data:`weightformer.models.weightformer_long_range.LONG_RANGE_ARGS`) and written into the run's
``model_kwargs``, so the run's checkpoints rebuild as it trained. Torch-free: the command line reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from .engine.config import TrainConfig, config_fields, setting
from .engine.errors import ConfigError

__all__ = ["LongRangeConfig"]


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
        from .models.names import LONG_RANGE_DESIGNS

        return LONG_RANGE_DESIGNS

    @classmethod
    def _released(cls, model: str) -> str:
        return {long: released for released, long in cls.long_range_designs().items()}.get(model, model)

    @classmethod
    def same_model(cls, base: str, other: str) -> bool:
        return cls._released(base) == cls._released(other)  # a design shares its released model's settings

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
        from .models.names import unknown_timm_model  # imports timm: here, so that the CLI starts without it

        super().check()
        problem = unknown_timm_model(self.model)
        if problem:
            raise ConfigError(problem)
