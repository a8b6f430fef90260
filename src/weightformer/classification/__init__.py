"""Image classification: the first task of the shared training engine (``weightformer train``)."""

from .task import ClassificationTask

__all__ = ["ClassificationTask"]
