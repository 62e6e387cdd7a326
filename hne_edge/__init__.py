"""hne-edge: distilled Hierarchical Neural Ensembles for anytime inference on edge devices.

The top-level package imports nothing heavy: ``hne_edge.tree`` and
``hne_edge.runtime`` work without torch. Model helpers (``create_model``,
``list_models``) load torch on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "create_model", "list_models"]


def create_model(name: str, num_classes: int | None = None, **overrides: Any):
    """Build a zoo model (see :func:`hne_edge.models.create_model`)."""
    from .models import create_model as _create

    return _create(name, num_classes=num_classes, **overrides)


def list_models(pattern: str = "*") -> list[str]:
    """Names of the registered zoo models."""
    from .models import list_models as _list

    return _list(pattern)
