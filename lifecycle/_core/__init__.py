"""Pure-Python core: states, the call gate, the cleaner, the loader, the budget policy.

Imports no TensorFlow: its tests run in milliseconds.
"""

from ._allocator import AllocatorChoice as AllocatorChoice
from ._allocator import current_choice as allocator_choice
from ._batcher import Batcher as Batcher
from ._batcher import BatchingPolicy as BatchingPolicy
from ._batcher import BatchingStatistics as BatchingStatistics
from ._budget import EvictionPlan as EvictionPlan
from ._budget import Resident as Resident
from ._budget import plan_eviction as plan_eviction
from ._checks import check_int as check_int
from ._checks import check_label as check_label
from ._checks import check_model_name as check_model_name
from ._checks import check_optional_int as check_optional_int
from ._checks import check_timeout as check_timeout
from ._checks import check_version as check_version
from ._checks import is_int as is_int
from ._cleaner import Cleaner as Cleaner
from ._cleaner import CleanerStatistics as CleanerStatistics
from ._cleaner import CleanupStrategy as CleanupStrategy
from ._cleaner import all_cleaners as all_cleaners
from ._cleaner import warn_from_finalizer as warn_from_finalizer
from ._counters import LIVE_MODELS as LIVE_MODELS
from ._counters import PROCESS as PROCESS
from ._gate import CallGate as CallGate
from ._kernels import KERNEL_CACHE as KERNEL_CACHE
from ._kernels import KernelCachePolicy as KernelCachePolicy
from ._kernels import KernelCacheStatistics as KernelCacheStatistics
from ._loader import Loader as Loader
from ._loader import check_foreground_bytes as check_foreground_bytes
from ._loader import check_gil_share as check_gil_share
from ._loader import check_nice as check_nice
from ._malloc import AllocatorSettings as AllocatorSettings
from ._malloc import tune_allocator as tune_allocator
from ._routing import check_key as check_key
from ._routing import check_weights as check_weights
from ._routing import key_fraction as key_fraction
from ._routing import pick as pick
from ._state import ModelState as ModelState
from ._state import SessionState as SessionState
from ._units import MiB as MiB

__all__ = [
    "KERNEL_CACHE",
    "LIVE_MODELS",
    "PROCESS",
    "AllocatorChoice",
    "AllocatorSettings",
    "Batcher",
    "BatchingPolicy",
    "BatchingStatistics",
    "CallGate",
    "Cleaner",
    "CleanerStatistics",
    "CleanupStrategy",
    "EvictionPlan",
    "KernelCachePolicy",
    "KernelCacheStatistics",
    "Loader",
    "MiB",
    "ModelState",
    "Resident",
    "SessionState",
    "all_cleaners",
    "allocator_choice",
    "check_foreground_bytes",
    "check_gil_share",
    "check_int",
    "check_key",
    "check_label",
    "check_model_name",
    "check_nice",
    "check_optional_int",
    "check_timeout",
    "check_version",
    "check_weights",
    "is_int",
    "key_fraction",
    "pick",
    "plan_eviction",
    "tune_allocator",
    "warn_from_finalizer",
]
