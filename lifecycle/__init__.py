"""keras-lifecycle: Keras 3 / TensorFlow models that give their memory back."""

from ._core import ModelState as ModelState
from ._model import DEFAULT_DISPOSE_TIMEOUT as DEFAULT_DISPOSE_TIMEOUT
from ._model import DisposeReport as DisposeReport
from ._model import ManagedModel as ManagedModel
from ._model import manage as manage
from ._serving import ServingFunction as ServingFunction
from ._serving import serving_function as serving_function
from ._tf import CompatibilityReport as CompatibilityReport
from ._tf import check_compatibility as check_compatibility
from .errors import CompatibilityError as CompatibilityError
from .errors import DisposedError as DisposedError
from .errors import DisposeInProgressError as DisposeInProgressError
from .errors import DrainTimeoutError as DrainTimeoutError
from .errors import LifecycleError as LifecycleError
from .errors import NotAModelError as NotAModelError

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_DISPOSE_TIMEOUT",
    "CompatibilityError",
    "CompatibilityReport",
    "DisposeInProgressError",
    "DisposeReport",
    "DisposedError",
    "DrainTimeoutError",
    "LifecycleError",
    "ManagedModel",
    "ModelState",
    "NotAModelError",
    "ServingFunction",
    "check_compatibility",
    "manage",
    "serving_function",
]
