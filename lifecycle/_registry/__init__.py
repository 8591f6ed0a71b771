"""The model registry: versions, leases, hot swap, A/B routing, budgets, watched directories.

Start with ``_registry.py`` (the coordinator); each module beside it holds one
concern, named in its docstring.
"""

from .._core._batcher import BatchingPolicy as BatchingPolicy
from .._core._batcher import BatchingStatistics as BatchingStatistics
from .._core._policies import SwapPolicy as SwapPolicy
from .._core._policies import VersionPolicy as VersionPolicy
from ._lease import ServingLease as ServingLease
from ._registry import ModelRegistry as ModelRegistry
from ._signature import Inference as Inference
from ._signature import NamedTensorSpec as NamedTensorSpec
from ._signature import ServingSignature as ServingSignature
from ._status import RegistryStatistics as RegistryStatistics
from ._status import VersionState as VersionState
from ._status import VersionStatus as VersionStatus
from ._version_dirs import VersionSource as VersionSource
from ._version_dirs import available_versions as available_versions
from ._version_dirs import version_source as version_source
from ._watching import ScanReport as ScanReport

__all__ = [
    "BatchingPolicy",
    "BatchingStatistics",
    "Inference",
    "ModelRegistry",
    "NamedTensorSpec",
    "RegistryStatistics",
    "ScanReport",
    "ServingLease",
    "ServingSignature",
    "SwapPolicy",
    "VersionPolicy",
    "VersionSource",
    "VersionState",
    "VersionStatus",
    "available_versions",
    "version_source",
]
