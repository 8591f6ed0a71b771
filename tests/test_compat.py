"""The compatibility self-check exercises each internal and fails loudly."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

import lifecycle as lc
from lifecycle._tf import _compat, _purge


def test_self_check_passes_on_the_pinned_versions():
    report = lc.check_compatibility()
    assert (report.tensorflow, report.keras) == (tf.__version__, keras.__version__)
    assert len(report.checks) == len(_compat._CHECKS)
    assert lc.check_compatibility() is report


@pytest.fixture
def fresh_check(monkeypatch):
    monkeypatch.setattr(_compat, "_report", None)


def test_a_moved_registry_fails_loudly_naming_versions(fresh_check, monkeypatch):
    monkeypatch.setattr(_purge, "registry", lambda: [])
    with pytest.raises(lc.CompatibilityError) as info:
        lc.check_compatibility()
    message = str(info.value)
    assert f"TensorFlow {tf.__version__} and Keras {keras.__version__}" in message
    assert "ops._gradient_registry" in message


def test_a_changed_closure_layout_fails_loudly(fresh_check, monkeypatch):
    # If TF stopped keeping graph tensors in the custom-gradient closure, the
    # purge would silently match nothing: the check must catch it.
    monkeypatch.setattr(_purge, "_MAX_DEPTH", 0)
    with pytest.raises(lc.CompatibilityError, match="entry not matched to its variable"):
        lc.check_compatibility()


def test_a_release_that_no_longer_frees_fails_loudly(fresh_check, monkeypatch):
    from lifecycle._tf import _release

    monkeypatch.setattr(_release, "is_released", lambda variable: False)
    with pytest.raises(lc.CompatibilityError, match="AssignVariableOp releases a buffer"):
        lc.check_compatibility()
