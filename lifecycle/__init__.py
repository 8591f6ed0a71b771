"""keras-lifecycle: Keras 3 / TensorFlow models that give their memory back."""

# ruff: noqa: E402 - the allocator is chosen before anything imports TensorFlow,
# which reads its allocator settings once.
import sys as _sys

from ._core import _allocator

if "tensorflow" in _sys.modules:  # `import keras` came first: ask whether it allocated
    from ._tf._memory import tensorflow_allocated as _allocated
else:
    _allocated = None
_allocator.apply_from_environment(tensorflow_allocated=_allocated)

from . import distribute as distribute
from . import integrations as integrations
from . import monitoring as monitoring
from . import testing as testing
from ._checkpoints import CheckpointKeeper as CheckpointKeeper
from ._checkpoints import restore_checkpoint as restore_checkpoint
from ._core import AllocatorChoice as AllocatorChoice
from ._core import AllocatorSettings as AllocatorSettings
from ._core import CleanerStatistics as CleanerStatistics
from ._core import CleanupStrategy as CleanupStrategy
from ._core import ModelState as ModelState
from ._core import SessionState as SessionState
from ._core import allocator_choice as allocator_choice
from ._core import tune_allocator as tune_allocator
from ._disposal import DEFAULT_DISPOSE_TIMEOUT as DEFAULT_DISPOSE_TIMEOUT
from ._disposal import DeviceRelease as DeviceRelease
from ._disposal import DisposeReport as DisposeReport
from ._model import ManagedModel as ManagedModel
from ._model import ModelStatistics as ModelStatistics
from ._model import manage as manage
from ._registry import BatchingPolicy as BatchingPolicy
from ._registry import BatchingStatistics as BatchingStatistics
from ._registry import Inference as Inference
from ._registry import ModelRegistry as ModelRegistry
from ._registry import NamedTensorSpec as NamedTensorSpec
from ._registry import RegistryStatistics as RegistryStatistics
from ._registry import ScanReport as ScanReport
from ._registry import ServingLease as ServingLease
from ._registry import ServingSignature as ServingSignature
from ._registry import SwapPolicy as SwapPolicy
from ._registry import VersionPolicy as VersionPolicy
from ._registry import VersionState as VersionState
from ._registry import VersionStatus as VersionStatus
from ._serving import ServingFunction as ServingFunction
from ._serving import serving_function as serving_function
from ._session import DEFAULT_PRESSURE_THRESHOLD as DEFAULT_PRESSURE_THRESHOLD
from ._session import DEFAULT_TRIM_THRESHOLD as DEFAULT_TRIM_THRESHOLD
from ._session import LifecycleSession as LifecycleSession
from ._session import SessionStatistics as SessionStatistics
from ._session import current_session as current_session
from ._tf import CompatibilityReport as CompatibilityReport
from ._tf import check_compatibility as check_compatibility
from .errors import BudgetExceededError as BudgetExceededError
from .errors import CheckpointError as CheckpointError
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

__all__ = [
    "DEFAULT_DISPOSE_TIMEOUT",
    "DEFAULT_PRESSURE_THRESHOLD",
    "DEFAULT_TRIM_THRESHOLD",
    "AllocatorChoice",
    "AllocatorSettings",
    "BatchingPolicy",
    "BatchingStatistics",
    "BudgetExceededError",
    "CheckpointError",
    "CheckpointKeeper",
    "CleanerStatistics",
    "CleanupStrategy",
    "CompatibilityError",
    "CompatibilityReport",
    "CoordinationError",
    "DeviceRelease",
    "DisposeInProgressError",
    "DisposeReport",
    "DisposedError",
    "DrainTimeoutError",
    "Inference",
    "LeakReport",
    "LifecycleError",
    "LifecycleSession",
    "LoadError",
    "ManagedModel",
    "ModelRegistry",
    "ModelState",
    "ModelStatistics",
    "NamedTensorSpec",
    "NotAModelError",
    "QueueFullError",
    "RegistryStatistics",
    "ScanReport",
    "ServingFunction",
    "ServingLease",
    "ServingSignature",
    "SessionState",
    "SessionStatistics",
    "Statistics",
    "SwapPolicy",
    "UnavailableError",
    "UnknownModelError",
    "VersionPolicy",
    "VersionState",
    "VersionStatus",
    "allocator_choice",
    "check_compatibility",
    "check_disposed",
    "current_session",
    "find_leaks",
    "manage",
    "restore_checkpoint",
    "serving_function",
    "statistics",
    "tune_allocator",
]
