"""Pure-Python core: states, the call gate and the cleaner. Imports no TensorFlow."""

from ._checks import check_timeout as check_timeout
from ._cleaner import Cleaner as Cleaner
from ._cleaner import CleanerStatistics as CleanerStatistics
from ._cleaner import CleanupStrategy as CleanupStrategy
from ._cleaner import running_cleaners as running_cleaners
from ._counters import PROCESS as PROCESS
from ._gate import CallGate as CallGate
from ._malloc import AllocatorSettings as AllocatorSettings
from ._malloc import tune_allocator as tune_allocator
from ._state import ModelState as ModelState
from ._state import SessionState as SessionState

__all__ = [
    "PROCESS",
    "AllocatorSettings",
    "CallGate",
    "Cleaner",
    "CleanerStatistics",
    "CleanupStrategy",
    "ModelState",
    "SessionState",
    "check_timeout",
    "running_cleaners",
    "tune_allocator",
]
