"""Carry a thread's model-building scope to another thread.

Keras 3 keeps its dtype policy per thread, and TensorFlow keeps the device
scope and the ``tf.distribute`` strategy scope per thread: a model built on
another thread would silently lose mixed precision, its device or its strategy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import keras
import tensorflow as tf
from tensorflow.python.eager import context

__all__ = ["capture_build_scope"]


def capture_build_scope() -> Callable[[], contextlib.AbstractContextManager[None]]:
    """The calling thread's dtype policy, device scope and strategy, to enter elsewhere.

    Returns:
        A function returning a context manager that applies them on the thread
        that enters it and restores that thread's dtype policy on exit.
    """
    policy = keras.config.dtype_policy()
    device = context.context().device_name  # "" outside any tf.device scope
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None

    @contextlib.contextmanager
    def scope() -> Iterator[None]:
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(policy)
        try:
            with contextlib.ExitStack() as stack:
                if device:
                    stack.enter_context(tf.device(device))
                if strategy is not None:
                    stack.enter_context(strategy.scope())
                yield
        finally:
            keras.config.set_dtype_policy(previous)

    return scope
