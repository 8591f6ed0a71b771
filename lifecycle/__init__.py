"""keras-lifecycle: Keras 3 / TensorFlow models that give their memory back.

``import lifecycle`` imports no TensorFlow: it applies ``LIFECYCLE_ALLOCATOR``
(which TensorFlow reads once, when it starts) and nothing else. Each name below
is imported on first use (PEP 562), with TensorFlow and the library's check of
its internals (``lifecycle/_tf/``) for the names that need them; the command
line and the pytest plugin start at once. Only when Keras is imported already
does ``import lifecycle`` import ``ManagedModel``, which registers it with Keras.

The everyday names are here. Tuning names (the CPU allocator, default
thresholds and timeouts) are in :mod:`lifecycle.tuning`; introspection names
(the self-check, per-object statistics) in :mod:`lifecycle.introspection`.

In IPython and Jupyter, ``%load_ext lifecycle`` disposes, after each cell, the
models the notebook no longer refers to (:mod:`lifecycle.integrations.ipython`).
"""

# First thing: the allocator is chosen before anything imports TensorFlow, which
# reads its allocator settings once.
import sys as _sys
import typing as _typing

from ._core import _allocator
from ._core._lazy import attach as _attach

if "tensorflow" in _sys.modules:  # `import keras` came first: ask whether it allocated
    from ._tf._memory import tensorflow_allocated as _allocated
else:
    _allocated = None
_allocator.apply_from_environment(tensorflow_allocated=_allocated)

if "keras" in _sys.modules:
    # Keras (and TensorFlow) came first: register ManagedModel with Keras now,
    # so that keras.models.load_model() finds it in a saved file.
    from . import _model as _model

if _typing.TYPE_CHECKING:
    from . import distribute as distribute
    from . import errors as errors
    from . import integrations as integrations
    from . import introspection as introspection
    from . import monitoring as monitoring
    from . import server as server
    from . import testing as testing
    from . import tuning as tuning
    from ._checkpoints import CheckpointKeeper as CheckpointKeeper
    from ._checkpoints import restore_checkpoint as restore_checkpoint
    from ._core import CleanupStrategy as CleanupStrategy
    from ._core import ModelState as ModelState
    from ._core import SessionState as SessionState
    from ._disposal import DisposeReport as DisposeReport
    from ._model import ManagedModel as ManagedModel
    from ._model import manage as manage
    from ._objects import ManagedObject as ManagedObject
    from ._registry import BatchingPolicy as BatchingPolicy
    from ._registry import Inference as Inference
    from ._registry import ModelRegistry as ModelRegistry
    from ._registry import NamedTensorSpec as NamedTensorSpec
    from ._registry import ScanReport as ScanReport
    from ._registry import ServingLease as ServingLease
    from ._registry import ServingSignature as ServingSignature
    from ._registry import SwapPolicy as SwapPolicy
    from ._registry import VersionPolicy as VersionPolicy
    from ._registry import VersionState as VersionState
    from ._registry import VersionStatus as VersionStatus
    from ._serving import ServingFunction as ServingFunction
    from ._serving import serving_function as serving_function
    from ._session import LifecycleSession as LifecycleSession
    from ._session import current_session as current_session
    from .errors import BudgetExceededError as BudgetExceededError
    from .errors import CheckpointError as CheckpointError
    from .errors import ClosedError as ClosedError
    from .errors import CompatibilityError as CompatibilityError
    from .errors import CoordinationError as CoordinationError
    from .errors import DisposedError as DisposedError
    from .errors import DisposeInProgressError as DisposeInProgressError
    from .errors import DrainTimeoutError as DrainTimeoutError
    from .errors import LifecycleError as LifecycleError
    from .errors import LoadError as LoadError
    from .errors import NotAModelError as NotAModelError
    from .errors import QueueFullError as QueueFullError
    from .errors import UnavailableError as UnavailableError
    from .errors import UnknownModelError as UnknownModelError
    from .monitoring import LeakReport as LeakReport
    from .monitoring import Statistics as Statistics
    from .monitoring import check_disposed as check_disposed
    from .monitoring import find_leaks as find_leaks
    from .monitoring import statistics as statistics

__version__ = "0.1.0"

# The TYPE_CHECKING block above is the one declaration of each public name: type
# checkers read it, and `_attach` derives __all__ and the imports on first use from it.
_getattr, __dir__, __all__ = _attach(__name__, unlisted=("server",))  # server: serve extra
# IPython's extension protocol (`%load_ext lifecycle`, docs/notebooks.md): IPython
# looks the two hooks up with hasattr(). Served here on each lookup, they are not
# names of the library: not in __all__ or dir(), and not kept as attributes.
_IPYTHON_HOOKS = ("load_ipython_extension", "unload_ipython_extension")


def __getattr__(name: str) -> _typing.Any:
    if name in _IPYTHON_HOOKS:
        from .integrations import ipython

        return getattr(ipython, name)
    return _getattr(name)
