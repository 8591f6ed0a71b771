"""When TensorFlow's eager kernel cache is cleared.

The cache keeps a kernel for every distinct op it ran, and the key of an op
includes its attributes and the dtype and shape of its resource inputs. A
variable's creation runs ops whose attributes name the variable, so every
variable ever created leaves kernels no later variable reuses, for every
buffer of a disposed model, freed only by clearing the cache (their size is
in ``docs/sessions.md#byte-pressure``).
The same cache holds what a release needs: the kernels of ``AssignVariableOp``
for each variable shape, built by an earlier release or beforehand by the
cleaner (``_tf.warm_release``). Clearing it between a model's build and its
dispose makes the dispose rebuild one kernel per distinct shape (ResNet50
has 30), each a build on the caller's thread.

So the cache is cleared only once enough buffers were released since the last
clear for their stale kernels to matter: by the cleaner after a ``dispose()``
(which needs no collection), by a dropped model's clean-up, or by a collection.
A collection raised by a large model's allocation keeps that model's kernels.
The policy is process-wide, like the cache.
"""

from __future__ import annotations

import threading

import attrs

from ._checks import check_int

__all__ = ["KERNEL_CACHE", "KERNEL_CACHE_BUFFERS", "KernelCachePolicy", "KernelCacheStatistics"]

#: Buffers released since the last clear after which a collection clears the
#: kernel cache: enough stale kernels to be worth the rebuilds a clear costs the
#: live models (``docs/sessions.md#byte-pressure`` has the sizes).
KERNEL_CACHE_BUFFERS = 32


@attrs.frozen
class KernelCacheStatistics:
    """A snapshot of the kernel-cache policy.

    Attributes:
        threshold: Buffers released since the last clear after which the
            cache is cleared.
        pending_buffers: Buffers released since the last clear.
        clears: Times the cache was cleared.
        skipped: Collections that left it, too few buffers having been released.
    """

    threshold: int
    pending_buffers: int
    clears: int
    skipped: int


class KernelCachePolicy:
    """Counts released buffers; tells a collection whether to clear the kernel cache.

    Args:
        threshold: Released buffers after which the next collection clears
            the cache (at least 1).

    Raises:
        ValueError: If ``threshold`` is not a positive integer.
    """

    def __init__(self, threshold: int = KERNEL_CACHE_BUFFERS) -> None:
        check_int(threshold, "threshold", minimum=1, what="a number of buffers")
        self._lock = threading.Lock()
        self._threshold = threshold
        self._pending = 0
        self._clears = 0
        self._skipped = 0

    def note_released(self, buffers: int) -> None:
        """Count buffers a release (a dispose, a dropped model's clean-up) just let go."""
        with self._lock:
            self._pending += buffers

    def due(self) -> bool:
        """Whether enough buffers were released for a clear (counts nothing)."""
        with self._lock:
            return self._pending >= self._threshold

    def take(self) -> bool:
        """Whether this collection should clear the cache; counts the answer.

        ``True`` resets the count: the caller clears the cache right after.
        """
        with self._lock:
            if self._pending >= self._threshold:
                self._pending = 0
                self._clears += 1
                return True
            self._skipped += 1
            return False

    def statistics(self) -> KernelCacheStatistics:
        """The counters, at one instant."""
        with self._lock:
            return KernelCacheStatistics(
                threshold=self._threshold,
                pending_buffers=self._pending,
                clears=self._clears,
                skipped=self._skipped,
            )


#: The policy of this process (the kernel cache is process-wide).
KERNEL_CACHE = KernelCachePolicy()
