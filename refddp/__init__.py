"""refddp: a reference PyTorch DDP trainer and a pytest harness for multi-process tests.

``build_model(config)`` and ``build_datasets(config)`` rebuild a run's model and data from the
``config`` dict stored in any refddp checkpoint, in a plain Python process. A ``model`` or
``data`` of the form ``package.module:callable`` is imported and called, so pass only configs
whose import paths you trust.
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["build_datasets", "build_model", "__version__"]

if TYPE_CHECKING:
    from refddp.workload.data import build_datasets
    from refddp.workload.models import build_model


def __getattr__(name: str) -> Any:
    # Lazy so that `import refddp` (and the pytest plugin) does not import torch up front.
    if name == "build_model":
        from refddp.workload.models import build_model

        return build_model
    if name == "build_datasets":
        from refddp.workload.data import build_datasets

        return build_datasets
    raise AttributeError(f"module 'refddp' has no attribute {name!r}")
