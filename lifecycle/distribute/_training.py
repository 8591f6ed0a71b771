"""A small training loop for the strategies Keras 3's ``fit`` does not run under."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from .. import _tf
from .._core import check_int
from .._disposal import held

__all__ = ["train"]


def train(
    model: keras.Model,
    dataset_fn: Callable[[], tf.data.Dataset],
    *,
    steps: int,
    strategy: tf.distribute.Strategy | None = None,
) -> float:
    """Run ``steps`` training steps of a compiled model under its strategy.

    Keras 3's ``fit`` does not run under ``ParameterServerStrategy`` and is
    broken under ``MultiWorkerMirroredStrategy`` with several workers; use
    ``fit`` everywhere else. This loop does what ``fit``'s train step does —
    forward pass, the compiled loss (scaled for the replicas), gradients,
    ``optimizer.apply_gradients`` — with ``ClusterCoordinator.schedule`` under a
    parameter-server strategy and ``strategy.run`` otherwise. No callbacks,
    metrics or validation.

    The model is held like a call while the loop runs: ``dispose()`` waits for
    it.

    Args:
        model: A compiled model whose variables were created under the strategy.
        dataset_fn: Builds the training data: a ``tf.data.Dataset`` of
            ``(x, y)`` batches, repeated as needed. It is called on each worker
            (parameter servers) or for each input pipeline.
        steps: Number of steps (batches per worker) to run.
        strategy: The strategy; by default the one the model's variables were
            created under, else the current one.

    Returns:
        The loss of the last step (averaged over replicas).

    Raises:
        ValueError: The model is not compiled, or ``steps`` is not a positive int.
        NotImplementedError: Some variables are sharded (a parameter-server
            partitioner); Keras 3's optimizers cannot update them.
        DisposedError: The model was disposed.
        CompatibilityError: A TensorFlow/Keras internal the library relies on
            has moved (the self-check runs once per process).

    Example:
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = lc.ManagedModel(inputs, outputs)
        ...     model.compile("adam", "mse")
        >>> lc.distribute.train(model, make_dataset, steps=100)  # doctest: +SKIP
        0.0123
    """
    _tf.check_compatibility()
    check_int(steps, "steps", minimum=1)
    if getattr(model, "optimizer", None) is None:
        raise ValueError(f"Compile {type(model).__name__} {model.name!r} before training it.")
    if strategy is None:
        strategy = _tf.strategies.strategy_of(model) or tf.distribute.get_strategy()
    sharded = [v.path for v in model.trainable_variables if _tf.strategies.is_sharded(v)]
    if sharded:
        raise NotImplementedError(
            f"Cannot train {type(model).__name__} {model.name!r}: {len(sharded)} of its "
            f"variables are sharded by a partitioner ({', '.join(sharded[:3])}, ...), and "
            f"Keras {keras.__version__}'s optimizers cannot update sharded variables. "
            "Create the strategy without variable_partitioner to train; dispose() "
            "releases sharded variables either way."
        )

    def replica_step(x: Any, y: Any) -> tf.Tensor:
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred)
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        model.optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    @tf.function
    def step(iterator: Any) -> Any:
        x, y = next(iterator)
        return strategy.run(replica_step, args=(x, y))

    with held(model, "lifecycle.distribute.train()"), strategy.scope():
        # Slots built under the scope live where the strategy puts variables
        # (on the parameter servers), not on the chief.
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        if isinstance(strategy, tf.distribute.ParameterServerStrategy):
            coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
            iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
            for _ in range(steps):
                last = coordinator.schedule(step, args=(iterator,))
            coordinator.join()
            return float(last.fetch())
        iterator = iter(strategy.distribute_datasets_from_function(lambda _: dataset_fn()))
        for _ in range(steps):
            losses = step(iterator)
        return float(strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None))
