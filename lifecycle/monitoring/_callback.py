"""A Keras callback: safe points during ``fit`` and memory numbers in ``logs``."""

from __future__ import annotations

from typing import Any

import keras

from .._core import MiB, check_optional_int
from .._session import current_session
from ._statistics import statistics

__all__ = ["LifecycleCallback"]


class LifecycleCallback(keras.callbacks.Callback):
    """Runs the session's safe point during training and logs memory per epoch.

    - Every ``safe_point_every`` batches and at each epoch end, runs the safe
      point of the model's session (the current session for a model that is
      not managed): an ``ON_SAFE_POINTS`` session cleans up there.
    - At each epoch end, adds to ``logs`` (so to ``History`` and every later
      callback): ``lifecycle_rss_mib``, ``lifecycle_owned_mib`` (bytes owned by
      live managed models), ``lifecycle_live_models`` and
      ``lifecycle_collections``.
    - With ``log_dir``, also writes them as TensorBoard scalars.

    Args:
        safe_point_every: Batches between safe points; ``None`` for epoch ends only.
        log_dir: A TensorBoard log directory for the scalars, or ``None``
            (needs the ``tensorboard`` extra).

    Raises:
        ValueError: A bad ``safe_point_every``.
        ImportError: ``log_dir`` is given and TensorBoard is not installed.

    Example:
        >>> model.fit(x, y, epochs=5, callbacks=[LifecycleCallback()])  # doctest: +SKIP
        >>> history.history["lifecycle_rss_mib"]  # doctest: +SKIP
        [612.3, 612.9, 612.8, 612.9, 612.9]
    """

    def __init__(self, *, safe_point_every: int | None = 100, log_dir: str | None = None) -> None:
        super().__init__()
        check_optional_int(safe_point_every, "safe_point_every", minimum=1)
        if log_dir is not None:
            try:
                import tensorboard  # noqa: F401 - tf.summary needs it
            except ImportError as error:
                raise ImportError(
                    "TensorBoard scalars need tensorboard, an optional extra: "
                    'pip install "keras-lifecycle[tensorboard]"'
                ) from error
        self.safe_point_every = safe_point_every
        self.log_dir = log_dir
        self._writer: Any = None

    def _session(self) -> Any:
        record = getattr(self.model, "_lifecycle", None)
        return record.owner if record is not None else current_session()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.safe_point_every is not None and (batch + 1) % self.safe_point_every == 0:
            self._session().cleaner.safe_point()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._session().cleaner.safe_point()
        stats = statistics(count_graphs=False)
        values = {
            "lifecycle_rss_mib": (stats.rss_bytes or 0) / MiB,
            "lifecycle_owned_mib": stats.bytes_owned / MiB,
            "lifecycle_live_models": float(stats.live_models),
            "lifecycle_collections": float(stats.collections),
        }
        if logs is not None:
            logs.update(values)
        if self.log_dir is not None:
            import tensorflow as tf

            if self._writer is None:
                self._writer = tf.summary.create_file_writer(self.log_dir)
            with self._writer.as_default():
                for name, value in values.items():
                    tf.summary.scalar(name, value, step=epoch)
            self._writer.flush()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
