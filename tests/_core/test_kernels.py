"""The kernel-cache policy on its own: when a collection clears TensorFlow's kernel cache."""

from __future__ import annotations

import pytest

from lifecycle._core import KERNEL_CACHE, KernelCachePolicy, KernelCacheStatistics
from lifecycle._core._kernels import KERNEL_CACHE_BUFFERS


def test_a_collection_clears_only_once_enough_buffers_were_released():
    policy = KernelCachePolicy(threshold=3)
    assert policy.take() is False  # nothing released: a collection raised by allocations
    policy.note_released(2)
    assert policy.due() is False and policy.take() is False
    policy.note_released(1)
    assert policy.statistics() == KernelCacheStatistics(
        threshold=3, pending_buffers=3, clears=0, skipped=2
    )
    assert policy.due() is True  # asking counts nothing
    assert policy.statistics().skipped == 2
    assert policy.take() is True
    assert policy.due() is False
    # The clear resets the count: the next collection waits for new releases.
    assert policy.take() is False
    assert policy.statistics() == KernelCacheStatistics(
        threshold=3, pending_buffers=0, clears=1, skipped=3
    )


def test_one_large_release_clears_at_the_next_collection():
    policy = KernelCachePolicy(threshold=32)
    policy.note_released(752)  # ResNet50 with Adam
    assert policy.take() is True
    assert policy.statistics().pending_buffers == 0


@pytest.mark.parametrize("threshold", [0, -1, 1.5, True, "32"])
def test_a_bad_threshold_is_refused_with_its_value(threshold):
    expected = f"`threshold` must be .*Received: threshold={threshold!r}"
    with pytest.raises(ValueError, match=expected):
        KernelCachePolicy(threshold=threshold)


def test_the_process_policy_uses_the_default_threshold():
    assert KERNEL_CACHE.statistics().threshold == KERNEL_CACHE_BUFFERS == 32
