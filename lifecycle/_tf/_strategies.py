"""What dispose() needs to know about ``tf.distribute``: strategies and a barrier.

Under ``MultiWorkerMirroredStrategy`` every worker holds its own replicas and
every training step all-reduces across workers. A worker that released its
variables alone would leave its peers blocked in their next all-reduce, so
disposal starts with a barrier: an all-reduce that completes only when every
worker has reached it, with a timeout.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy, sharded_variable

from ._internal import internal
from ._resources import keras_variables, tf_variable

__all__ = [
    "NUM_WORKERS",
    "barrier",
    "is_sharded",
    "needs_barrier",
    "strategy_of",
    "variables_strategy",
]

#: Where ``CollectiveAllReduceExtended`` keeps the number of workers.
NUM_WORKERS = "_num_workers"


def strategy_of(model: keras.Model) -> tf.distribute.Strategy | None:
    """The strategy the model's variables were created under, if any."""
    return variables_strategy(keras_variables(model))


def variables_strategy(variables: Iterable[Any]) -> tf.distribute.Strategy | None:
    """The strategy the first of ``variables`` that has one was created under, if any.

    Args:
        variables: Keras variables, as ``keras_variables(model)`` returns them.
    """
    for variable in variables:
        inner = tf_variable(variable)
        if inner is None:
            continue
        strategy = internal(
            inner, "_distribute_strategy", f"{type(inner).__name__}._distribute_strategy"
        )
        if strategy is not None:
            return strategy
    return None


def needs_barrier(strategy: Any) -> bool:
    """Whether disposing under ``strategy`` must be coordinated across workers.

    Raises:
        CompatibilityError: The worker count is no longer in
            ``CollectiveAllReduceExtended._num_workers``. Guessing one worker
            would skip the barrier and leave the peers hanging.
    """
    if not isinstance(strategy, collective_all_reduce_strategy.CollectiveAllReduceStrategy):
        return False
    workers = internal(strategy.extended, NUM_WORKERS, f"CollectiveAllReduceExtended.{NUM_WORKERS}")
    return int(workers) > 1


def barrier(strategy: tf.distribute.Strategy, timeout: float | None) -> int:
    """Wait until every replica of every worker reaches this call.

    Returns:
        The number of replicas that joined (all of them).

    Raises:
        tf.errors.DeadlineExceededError: Some worker did not join in ``timeout``
            seconds. TensorFlow then aborts this worker's collectives.
        tf.errors.OpError: The collective failed otherwise (a peer is gone).
    """
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)

    def join() -> tf.Tensor:
        context = tf.distribute.get_replica_context()
        return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([]), options=options)

    @tf.function
    def run() -> Any:
        return strategy.run(join)

    with tf.init_scope():
        joined = strategy.experimental_local_results(run())[0]
    return int(joined.numpy())


def is_sharded(variable: Any) -> bool:
    """Whether a Keras variable is split into shards (a parameter-server partitioner)."""
    return isinstance(tf_variable(variable), sharded_variable.ShardedVariableMixin)
