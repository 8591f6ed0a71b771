"""Pure-Python core: states and the call gate. Imports no TensorFlow."""

from ._gate import CallGate as CallGate
from ._state import ModelState as ModelState

__all__ = ["CallGate", "ModelState"]
