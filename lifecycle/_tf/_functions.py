"""Traced functions: TensorFlow's retracing warning.

TensorFlow warns when calls to functions sharing one Python body trace often
("5 out of the last 5 calls to <function ...> triggered tf.function
retracing"). Every serving function of a registry shares one body, and each
version traces it once by design: after five swaps every load would log the
warning. ``Function._omit_frequent_tracing_warning`` turns it off per function.
"""

from __future__ import annotations

from typing import Any

__all__ = ["omit_retracing_warning"]


def omit_retracing_warning(function: Any) -> None:
    """Stop TensorFlow's frequent-retracing warning for one ``tf.function``."""
    if not hasattr(function, "_omit_frequent_tracing_warning"):
        raise AttributeError("tf.function no longer has _omit_frequent_tracing_warning")
    function._omit_frequent_tracing_warning = True
