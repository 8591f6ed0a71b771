"""Batched serving: a version's serving function behind a :class:`Batcher`.

:class:`BatchedServe` stands where the version's ``serve`` stood, so
``predict``, ``infer`` and every protocol of the server batch alike. A request
joins a batch when its inputs fit the traced signature: the same structure,
each input convertible to its dtype, and every input with the same number of
rows. Other requests (a wrong shape, say) call the serving function directly
and fail, alone, with its own error. A batch is the requests' inputs
concatenated row-wise (padded up to an allowed size by repeating the first
row); its outputs are split back so that every caller gets exactly its rows.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tensorflow as tf

from .._core._batcher import Batcher, BatchingPolicy, BatchingStatistics
from .._serving import Leaf, ServingFunction, flatten_as

__all__ = ["BatchedServe"]


class BatchedServe:
    """A version's serving function whose concurrent calls are batched.

    Args:
        serve: The version's serving function, traced with an input signature.
        policy: Batch sizes and timeout.
    """

    def __init__(self, serve: ServingFunction, policy: BatchingPolicy) -> None:
        self.serve = serve
        self.policy = policy
        self._specs, _ = serve.structure()
        self._flat_specs: list[tf.TensorSpec] = tf.nest.flatten(self._specs)
        self._dtypes = [spec.dtype.as_numpy_dtype for spec in self._flat_specs]
        # Each input's dims; None for an input of unknown rank, which never joins a batch.
        self._leaves = [
            None if spec.shape.rank is None else Leaf.of(spec) for spec in self._flat_specs
        ]
        self._batcher = Batcher(self._run, policy)

    def __call__(self, inputs: Any) -> Any:
        """The serving function's outputs for ``inputs``, computed in a batch if they fit one."""
        prepared = self._prepare(inputs)
        if prepared is None:
            return self.serve(inputs)
        leaves, rows, kind = prepared
        return self._batcher.submit(leaves, rows, kind)

    def statistics(self) -> BatchingStatistics:
        """What the batching did so far."""
        return self._batcher.statistics()

    def warm_up(self, sample: Any) -> None:
        """Call the serving function once per allowed batch size, on ``sample``'s first row.

        So that no shape a batch can take is seen first under load.
        """
        prepared = self._prepare(sample)
        if prepared is None:
            return
        leaves, _, _ = prepared
        for size in self.policy.allowed_batch_sizes:
            rows = [np.repeat(leaf[:1], size, axis=0) for leaf in leaves]
            self.serve(tf.nest.pack_sequence_as(self._specs, rows))

    def _prepare(self, inputs: Any) -> tuple[list[np.ndarray], int, tuple[Any, ...]] | None:
        """``(arrays, rows, kind)`` of a request that can join a batch, else None."""
        flat = flatten_as(self._specs, inputs)
        if flat is None:
            return None
        leaves, kind, rows = [], [], None
        for value, spec, dtype, leaf in zip(
            flat, self._flat_specs, self._dtypes, self._leaves, strict=True
        ):
            try:
                if isinstance(value, tf.Tensor):
                    if value.dtype != spec.dtype:
                        return None
                    array = value.numpy()
                else:
                    array = np.asarray(value, dtype=dtype)
            except (TypeError, ValueError):
                return None
            shape = array.shape
            # A scalar has no rows to batch; every input must have as many rows.
            if leaf is None or not shape or not leaf.fits(shape):
                return None
            if rows is None:
                rows = shape[0]
            elif shape[0] != rows:
                return None
            leaves.append(array)
            kind.append(shape[1:])
        if not rows:
            return None
        return leaves, rows, tuple(kind)

    def _run(self, items: list[list[np.ndarray]], pad_to: int) -> list[Any]:
        """Serve ``items`` in one call of the serving function; each item's outputs."""
        # The items' arrays were checked against the signature by _prepare.
        if len(items) == 1 and pad_to == len(items[0][0]):
            return [self.serve._call_fitting(items[0])]
        counts = [len(item[0]) for item in items]
        total = sum(counts)
        merged = []
        for parts in zip(*items, strict=True):
            batch = np.concatenate(parts) if len(parts) > 1 else parts[0]
            if pad_to > total:
                batch = np.concatenate([batch, np.repeat(batch[:1], pad_to - total, axis=0)])
            merged.append(batch)
        outputs = self.serve._call_fitting(merged)
        sizes = tuple(counts) + ((pad_to - total,) if pad_to > total else ())
        size_splits, axis = _split_arguments(sizes)
        count = len(sizes)
        split = [
            tf.raw_ops.SplitV(value=output, size_splits=size_splits, axis=axis, num_split=count)
            for output in tf.nest.flatten(outputs)
        ]
        return [
            tf.nest.pack_sequence_as(outputs, [parts[i] for parts in split])
            for i in range(len(items))
        ]


@functools.lru_cache(maxsize=256)
def _split_arguments(sizes: tuple[int, ...]) -> tuple[tf.Tensor, tf.Tensor]:
    """``SplitV``'s ``size_splits`` and ``axis`` tensors for ``sizes``, made once per sizes.

    Batches of batch-1 requests repeat a few sizes. ``tf.split`` converts its
    Python list on every call and goes through the API's dispatch: about three
    times the cost of the op with these tensors given.
    """
    with tf.init_scope():
        return tf.constant(sizes, dtype=tf.int64), tf.constant(0)


def as_batched(serve: ServingFunction, policy: BatchingPolicy | None) -> Any:
    """``serve`` behind a batcher with ``policy``, or ``serve`` itself without one."""
    return serve if policy is None else BatchedServe(serve, policy)


def batching_statistics(serve: Any) -> BatchingStatistics | None:
    """The batching statistics of a version's ``serve``, or None if it is not batched."""
    return serve.statistics() if isinstance(serve, BatchedServe) else None
