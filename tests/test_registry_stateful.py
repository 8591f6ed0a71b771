"""A property-based, stateful test of the registry's operations (hypothesis).

A plain-Python reference model predicts the outcome of every operation —
success, or which error — and which versions may answer a request; the real
registry must agree, and its status must match the reference after each step.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support.models import constant

import lifecycle as lc

X = np.ones((1, 4), "float32")
VERSIONS = st.integers(1, 4)
LABELS = st.sampled_from(["stable", "canary"])


class RegistryMachine(RuleBasedStateMachine):
    OPTIONS: ClassVar[dict[str, float]] = {}

    def __init__(self):
        super().__init__()
        self.registry = lc.ModelRegistry(lease_timeout=0.01, **self.OPTIONS)
        self.loaded: set[int] = set()
        self.default: int | None = None
        self.labels: dict[str, int] = {}
        self.route_weights: dict | None = None

    @rule(version=VERSIONS)
    def load(self, version):
        if version in self.loaded:
            with pytest.raises(ValueError, match="already loaded"):
                self.registry.load("m", version, constant(version))
            return
        self.registry.load("m", version, constant(version))
        self.loaded.add(version)
        if self.default is None:
            self.default = version

    @rule(version=VERSIONS)
    def promote(self, version):
        if version not in self.loaded:
            with pytest.raises(lc.UnknownModelError):
                self.registry.promote("m", version)
            return
        self.registry.promote("m", version)
        self.default = version

    @rule(version=VERSIONS)
    def unload(self, version):
        if version not in self.loaded:
            with pytest.raises(lc.UnknownModelError):
                self.registry.unload("m", version)
        elif version in self.labels.values() or (
            self.route_weights is not None and version in self.route_weights
        ):
            with pytest.raises(ValueError, match="still pointed to"):
                self.registry.unload("m", version)
        elif version == self.default and len(self.loaded) > 1:
            with pytest.raises(ValueError, match="is the default"):
                self.registry.unload("m", version)
        else:
            self.registry.unload("m", version, wait=True)
            self.loaded.remove(version)
            if self.default == version:
                self.default = None

    @rule(label=LABELS, version=VERSIONS)
    def set_label(self, label, version):
        if version not in self.loaded:
            with pytest.raises(lc.UnknownModelError):
                self.registry.set_label("m", label, version)
            return
        self.registry.set_label("m", label, version)
        self.labels[label] = version

    @rule(
        weights=st.dictionaries(
            st.one_of(VERSIONS, LABELS),
            st.one_of(st.integers(-1, 3), st.floats(0, 3, allow_nan=False)),
            max_size=3,
        )
    )
    def route(self, weights):
        if not self.loaded:
            with pytest.raises(lc.UnknownModelError):
                self.registry.route("m", weights)
            return
        if any(w < 0 for w in weights.values()) or not sum(weights.values()) > 0:
            with pytest.raises(ValueError):
                self.registry.route("m", weights)
            return
        unknown = [
            t
            for t in weights
            if (t not in self.labels if isinstance(t, str) else t not in self.loaded)
        ]
        if unknown:
            with pytest.raises(lc.UnknownModelError):
                self.registry.route("m", weights)
            return
        self.registry.route("m", weights)
        self.route_weights = dict(weights)

    @rule()
    def clear_route(self):
        if self.loaded:
            self.registry.route("m", None)
            self.route_weights = None

    @rule(key=st.one_of(st.none(), st.text(max_size=4)))
    def predict(self, key):
        if not self.loaded:
            with pytest.raises(lc.UnknownModelError):
                self.registry.predict("m", X, key=key)
            return
        if self.route_weights is not None:
            allowed = {
                self.labels[t] if isinstance(t, str) else t
                for t, w in self.route_weights.items()
                if w > 0
            }
        elif self.default is not None:
            allowed = {self.default}
        else:
            with pytest.raises(lc.UnavailableError):
                self.registry.predict("m", X, key=key)
            return
        assert int(self.registry.predict("m", X, key=key).numpy()[0, 0]) in allowed

    @invariant()
    def status_matches(self):
        status = self.registry.status()
        assert {s.version for s in status} == self.loaded
        assert {s.version for s in status if s.default} == (
            {self.default} if self.default is not None else set()
        )
        for s in status:
            assert set(s.labels) == {lb for lb, v in self.labels.items() if v == s.version}
            assert s.state is lc.VersionState.READY and s.leases == 0

    def teardown(self):
        self.registry.close()


RegistryMachine.TestCase.settings = settings(
    max_examples=8,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_registry_operations = RegistryMachine.TestCase


class BackgroundRegistryMachine(RegistryMachine):
    """The same operations with loads on the loader thread (paced)."""

    OPTIONS: ClassVar[dict[str, float]] = {"loader_gil_share": 0.5}


BackgroundRegistryMachine.TestCase.settings = settings(
    max_examples=4,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_registry_operations_with_background_loads = BackgroundRegistryMachine.TestCase
