"""ModelRegistry: isolation, leases, swaps, routing, budget, failures."""

from __future__ import annotations

import contextlib
import threading
import time

import attrs
import keras
import numpy as np
import pytest
from support.models import X, answer, constant
from support.waits import joined, wait_until

import lifecycle as lc
from lifecycle._core import key_fraction

# --- loading ------------------------------------------------------------------------


def test_versions_get_isolated_identical_paths_and_the_caller_keeps_its_names(registry):
    before = keras.layers.Dense(1).name
    registry.load("risk", 3, constant(3.0))
    registry.load("risk", 4, constant(4.0))
    after = keras.layers.Dense(1).name
    paths = {}
    for version in (3, 4):
        with registry.lease("risk", version=version) as model:
            paths[version] = sorted(w.path for w in model.weights)
    assert all(p.startswith("risk/v3/") for p in paths[3])
    relative = [[p.split("/", 2)[2] for p in paths[v]] for v in (3, 4)]
    assert relative[0] == relative[1] and relative[0]
    assert uid(after) == uid(before) + 1


def uid(layer_name):
    head, _, tail = layer_name.rpartition("_")
    return int(tail) if head else 0


def test_first_version_is_default_and_status_describes_it(registry):
    status = registry.load("risk", 1, constant(1.0), labels=["stable"])
    assert (status.state, status.default, status.labels, status.requests) == (
        lc.VersionState.READY,
        True,
        ("stable",),
        0,
    )
    assert status.bytes > 0 and status.load_seconds > 0
    assert answer(registry) == 1.0
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        status.bytes = 0
    assert registry.status("risk")[0].requests == 1


def test_load_from_a_keras_file_with_safe_mode(registry, tmp_path):
    path = tmp_path / "risk.keras"
    constant(7.0)().save(path)
    registry.load("risk", 1, path)
    assert answer(registry) == 7.0
    inputs = keras.Input((4,))
    lambda_model = keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2.0)(inputs))
    lambda_path = tmp_path / "lambda.keras"
    lambda_model.save(lambda_path)
    with pytest.raises(lc.LoadError, match="'lam' version 1 failed in its factory") as info:
        registry.load("lam", 1, lambda_path)
    assert "safe_mode" in str(info.value.__cause__)
    registry.load("lam", 1, lambda_path, safe_mode=False)
    assert registry.predict("lam", X).numpy()[0, 0] == 2.0


def test_a_missing_file_changes_nothing(registry, tmp_path):
    registry.load("risk", 1, constant(1.0))
    with pytest.raises(FileNotFoundError, match="No saved model at"):
        registry.load("risk", 2, tmp_path / "missing.keras")
    assert [s.version for s in registry.status()] == [1] and answer(registry) == 1.0


def test_a_subclassed_model_needs_a_warmup_sample(registry):
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(lc.LoadError, match=r"warm-up.*pass warmup="):
        registry.load("net", 1, Net)
    registry.load("net", 1, Net, warmup=X)
    with registry.lease("net") as model:
        assert model.weights[0].path.startswith("net/v1/")


@pytest.mark.parametrize(
    ("factory", "stage"),
    [
        (lambda: 1 / 0, "factory"),
        (lambda: "not a model", "factory"),
        (constant(9.0), "warm-up"),  # the warm-up sample below has the wrong shape
    ],
)
def test_a_failed_load_disposes_the_partial_model_and_keeps_serving(registry, factory, stage):
    registry.load("risk", 1, constant(1.0))
    children = registry._session.statistics().children
    with pytest.raises(lc.LoadError, match=f"'risk' version 2 failed in its {stage}"):
        registry.load("risk", 2, factory, warmup=np.ones((1, 3), "float32"))
    assert registry._session.statistics().children == children
    assert [s.version for s in registry.status()] == [1] and answer(registry) == 1.0


@pytest.mark.parametrize(
    ("name", "version", "fragment"),
    [
        ("a/b", 1, "without `/`"),
        ("", 1, "non-empty"),
        ("risk", -1, "int >= 0"),
        ("risk", True, "int"),
    ],
)
def test_bad_names_and_versions_are_rejected(registry, name, version, fragment):
    with pytest.raises(ValueError, match=fragment):
        registry.load(name, version, constant(1.0))
    assert registry.status() == ()


def test_a_version_loads_once(registry):
    registry.load("risk", 1, constant(1.0))
    with pytest.raises(ValueError, match="already loaded"):
        registry.load("risk", 1, constant(2.0))


# --- leases, swaps --------------------------------------------------------------------


def test_promote_then_unload_is_a_hot_swap(registry):
    registry.load("risk", 1, constant(1.0))
    registry.load("risk", 2, constant(2.0))
    assert answer(registry) == 1.0
    with pytest.raises(ValueError, match="is the default; promote another version"):
        registry.unload("risk", 1)
    registry.promote("risk", 2)
    assert answer(registry) == 2.0
    registry.unload("risk", 1, wait=True)
    assert [s.version for s in registry.status()] == [2]


def test_a_lease_keeps_a_retired_version_alive_until_returned(registry):
    registry.load("risk", 1, constant(1.0))
    registry.load("risk", 2, constant(2.0))
    registry.promote("risk", 2)
    with registry.lease("risk", version=1) as model:
        registry.unload("risk", 1)
        (status,) = [s for s in registry.status() if s.version == 1]
        assert (status.state, status.leases) == (lc.VersionState.RETIRING, 1)
        assert model.predict_on_batch(X)[0, 0] == 1.0  # still alive
        with pytest.raises(lc.UnknownModelError, match="no version 1"):
            registry.predict("risk", X, version=1)
    wait_until(lambda: [s.version for s in registry.status()] == [2], "version 1 retired")
    assert model.state is lc.ModelState.DISPOSED


@contextlib.contextmanager
def swap_in_gap(lease_timeout=30.0):
    """A resource-preserving registry whose load of version 2 is held in the gap.

    Yields the registry and a function that lets the build finish, once version
    1 is gone and version 2 is still building; the build finishes on exit anyway.
    """
    with lc.ModelRegistry(
        max_loaded=1, swap_policy=lc.SwapPolicy.RESOURCE_PRESERVING, lease_timeout=lease_timeout
    ) as reg:
        reg.load("risk", 1, constant(1.0))
        building, proceed = threading.Event(), threading.Event()

        def slow():
            building.set()
            proceed.wait(30)
            return constant(2.0)()

        loader = threading.Thread(target=lambda: reg.load("risk", 2, slow))
        loader.start()
        assert building.wait(30), "the build of version 2 did not start"

        def finish():
            proceed.set()
            joined(loader)

        try:
            yield reg, finish
        finally:
            finish()


def test_resource_preserving_swap_makes_requests_wait_for_the_new_version():
    answers = []
    with swap_in_gap() as (reg, finish):
        # The old one went first; the new one shows as loading.
        assert [(s.version, s.state) for s in reg.status()] == [(2, lc.VersionState.LOADING)]
        asking = threading.Event()

        def ask() -> None:
            asking.set()
            answers.append(answer(reg))

        waiter = threading.Thread(target=ask)
        waiter.start()
        assert asking.wait(30), "the request did not start"
        # An absence (no answer while in the gap), so a bounded wait, once the
        # request is under way.
        time.sleep(0.05)
        assert answers == [] and waiter.is_alive()  # waiting in the gap
        finish()
        joined(waiter)
    assert answers == [2.0]


def test_a_request_in_the_gap_fails_clearly_after_the_lease_timeout():
    with (
        swap_in_gap(lease_timeout=0.05) as (reg, _),
        pytest.raises(lc.UnavailableError, match="No routable version of 'risk'"),
    ):
        reg.predict("risk", X)


# --- budget -----------------------------------------------------------------------------


def test_availability_preserving_refuses_a_load_that_does_not_fit():
    with lc.ModelRegistry(max_loaded=1) as reg:
        reg.load("risk", 1, constant(1.0))
        with pytest.raises(lc.BudgetExceededError, match="Nothing changed"):
            reg.load("risk", 2, constant(2.0))
        assert [s.version for s in reg.status()] == [1] and answer(reg) == 1.0


def test_an_estimate_over_budget_is_refused_before_building():
    called = []
    with lc.ModelRegistry(memory_budget=10_000) as reg:
        with pytest.raises(lc.BudgetExceededError, match="would exceed"):
            reg.load("big", 1, lambda: called.append(1), estimated_bytes=20_000)
        assert called == [] and reg.status() == ()


def resource_preserving(**options):
    return lc.ModelRegistry(swap_policy=lc.SwapPolicy.RESOURCE_PRESERVING, **options)


def failing():
    raise RuntimeError("no such architecture")


def test_a_failed_load_brings_back_the_version_it_evicted():
    with resource_preserving(max_loaded=1) as reg:
        reg.load("risk", 1, constant(1.0))
        with pytest.raises(lc.LoadError) as raised:
            reg.load("risk", 2, failing)
        message = str(raised.value)
        assert "were loaded again: 'risk' version 1" in message, message
        assert "registry is unchanged" not in message
        status = reg.status("risk")
        assert [(s.version, s.state, s.default) for s in status] == [
            (1, lc.VersionState.READY, True)
        ]
        assert answer(reg) == 1.0


def test_a_load_over_budget_after_building_brings_back_what_it_evicted():
    one = constant(1.0)().count_params() * 4
    with resource_preserving(max_loaded=1, memory_budget=2 * one) as reg:
        reg.load("risk", 1, constant(1.0))
        with pytest.raises(lc.BudgetExceededError) as raised:
            reg.load("risk", 2, constant(2.0, units=64), estimated_bytes=one)
        assert "were loaded again: 'risk' version 1" in str(raised.value)
        assert [s.version for s in reg.status()] == [1] and answer(reg) == 1.0


def test_a_failed_load_says_exactly_what_it_could_not_bring_back():
    builds = []

    def first_time_only():
        builds.append(1)
        if len(builds) > 1:
            raise RuntimeError("the source is gone")
        return constant(1.0)()

    with resource_preserving(max_loaded=1) as reg:
        reg.load("risk", 1, first_time_only)
        with pytest.raises(lc.LoadError) as raised:
            reg.load("risk", 2, failing)
        message = str(raised.value)
        assert "could not be loaded again, so no longer loaded: 'risk' version 1" in message
        assert "the source is gone" in message and "unchanged" not in message
        assert reg.status() == ()


def test_a_failed_load_that_evicted_nothing_says_the_registry_is_unchanged(registry):
    registry.load("risk", 1, constant(1.0))
    with pytest.raises(lc.LoadError, match="registry is unchanged"):
        registry.load("risk", 2, failing)
    assert [s.version for s in registry.status()] == [1]


def test_budget_evicts_least_recently_used_unpinned_versions():
    one = constant(1.0)().count_params() * 4
    with lc.ModelRegistry(memory_budget=3 * one) as reg:
        reg.load("a", 1, constant(1.0))
        reg.load("a", 2, constant(2.0))
        reg.load("a", 3, constant(3.0), labels=["canary"])
        answer(reg, "a", version=2)  # 2 is now more recently used than nothing else
        reg.load("b", 1, constant(4.0))  # needs room: evicts an unpinned, non-default version
        versions = {(s.name, s.version) for s in reg.status()}
        assert versions == {("a", 1), ("a", 3), ("b", 1)}
        assert answer(reg, "a", label="canary") == 3.0


def test_bad_registry_options_are_rejected():
    with pytest.raises(ValueError, match="Received: memory_budget=0"):
        lc.ModelRegistry(memory_budget=0)
    with pytest.raises(TypeError):
        lc.ModelRegistry(swap_policy="resource")
    with pytest.raises(ValueError, match="Received: lease_timeout=-1"):
        lc.ModelRegistry(lease_timeout=-1)


# --- routing -----------------------------------------------------------------------------


def test_route_splits_traffic_by_weight_within_tolerance(registry):
    registry.load("risk", 1, constant(1.0))
    registry.load("risk", 2, constant(2.0), labels=["canary"])
    registry.route("risk", {1: 3, "canary": 1})
    answers = [answer(registry, key=f"user-{i}") for i in range(2000)]
    share = answers.count(2.0) / len(answers)
    assert abs(share - 0.25) < 0.04  # 4 standard deviations at n=2000
    weights = {s.version: s.weight for s in registry.status()}
    assert weights == {1: 0.75, 2: 0.25}


@pytest.mark.slow
def test_routing_by_key_is_sticky_and_stable_across_processes(registry, run_child):
    registry.load("risk", 1, constant(1.0))
    registry.load("risk", 2, constant(2.0))
    registry.route("risk", {1: 1, 2: 1})
    first = [answer(registry, key=f"k{i}") for i in range(50)]
    assert first == [answer(registry, key=f"k{i}") for i in range(50)]
    assert set(first) == {1.0, 2.0}
    # BLAKE2b, not the salted hash(): the same in processes with other hash seeds.
    keys = ["user-42", "k7", "\u00e9t\u00e9"]
    code = f"from lifecycle._core import key_fraction; print([key_fraction(k) for k in {keys!r}])"
    for seed in ("1", "2"):
        out = run_child(code, env={"PYTHONHASHSEED": seed}, timeout=120)
        assert out.strip() == str([key_fraction(k) for k in keys])
    assert key_fraction("user-42") == 0.4360472144288925
    assert key_fraction(42) == key_fraction("42") and key_fraction(b"42") == key_fraction("42")


def test_labels_and_routes_follow_re_pointed_labels(registry):
    registry.load("risk", 1, constant(1.0), labels=["stable"])
    registry.load("risk", 2, constant(2.0))
    registry.route("risk", {"stable": 1})
    assert answer(registry, key="x") == 1.0
    registry.set_label("risk", "stable", 2)
    assert answer(registry, key="x") == 2.0


def test_remove_label_stops_its_requests_and_frees_its_version_to_unload(registry):
    registry.load("risk", 1, constant(1.0), labels=["stable"])
    registry.load("risk", 2, constant(2.0), labels=["canary", "beta"])
    registry.remove_label("risk", "canary")
    assert {s.version: s.labels for s in registry.status("risk")} == {1: ("stable",), 2: ("beta",)}
    with pytest.raises(lc.UnknownModelError, match="no label 'canary'"):
        answer(registry, label="canary")
    assert answer(registry, label="beta") == 2.0
    registry.remove_label("risk", "beta")
    registry.unload("risk", 2, wait=True)
    assert [s.version for s in registry.status("risk")] == [1]


def test_remove_label_refuses_a_label_the_route_goes_through(registry):
    registry.load("risk", 1, constant(1.0), labels=["stable"])
    registry.load("risk", 2, constant(2.0), labels=["canary"])
    registry.route("risk", {"stable": 1, "canary": 1})
    with pytest.raises(ValueError, match="label 'canary' is a target of the route"):
        registry.remove_label("risk", "canary")
    assert answer(registry, label="canary") == 2.0
    registry.route("risk", None)
    registry.remove_label("risk", "canary")
    assert registry.status("risk")[1].labels == ()


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda r: r.remove_label("risk", "gold"), lc.UnknownModelError, "no label 'gold'"),
        (lambda r: r.remove_label("nope", "canary"), lc.UnknownModelError, "No model named"),
        (lambda r: r.remove_label("risk", ""), ValueError, "non-empty string"),
        (lambda r: r.predict("nope", X), lc.UnknownModelError, "No model named 'nope'"),
        (lambda r: r.predict("risk", X, version=9), lc.UnknownModelError, "no version 9 ready"),
        (lambda r: r.predict("risk", X, label="gold"), lc.UnknownModelError, "no label 'gold'"),
        (lambda r: r.set_label("risk", "canary", 9), lc.UnknownModelError, "no ready version 9"),
        (lambda r: r.set_label("risk", "", 1), ValueError, "non-empty string"),
        (lambda r: r.promote("risk", 9), lc.UnknownModelError, "no ready version 9"),
        (lambda r: r.unload("risk", 9), lc.UnknownModelError, "no version 9"),
        (lambda r: r.route("risk", {1: -1}), ValueError, "finite and >= 0"),
        (lambda r: r.route("risk", {1: 0}), ValueError, "positive total"),
        (lambda r: r.route("risk", {1: "a"}), TypeError, "must be numbers"),
        (lambda r: r.route("risk", {"gold": 1}), lc.UnknownModelError, "no label 'gold'"),
        (lambda r: r.route("risk", {9: 1}), lc.UnknownModelError, "no ready version 9"),
        (lambda r: r.route("risk", [1]), TypeError, "must be a mapping"),
        (lambda r: r.predict("risk", X, key=1.5), TypeError, "key` must be a str"),
    ],
)
def test_bad_requests_fail_clearly_and_change_nothing(registry, call, error, fragment):
    registry.load("risk", 1, constant(1.0), labels=["canary"])
    before = registry.status()
    with pytest.raises(error, match=fragment):
        call(registry)
    after = registry.status()
    assert [attrs.evolve(s, requests=0) for s in after] == [
        attrs.evolve(s, requests=0) for s in before
    ]


def test_unload_refuses_a_labelled_or_routed_version(registry):
    registry.load("risk", 1, constant(1.0))
    registry.load("risk", 2, constant(2.0), labels=["canary"])
    with pytest.raises(ValueError, match="labels \\['canary'\\]"):
        registry.unload("risk", 2)
    registry.set_label("risk", "canary", 1)
    registry.route("risk", {2: 1})
    with pytest.raises(ValueError, match="the route"):
        registry.unload("risk", 2)


def test_close_unloads_everything_and_refuses_requests():
    registry = lc.ModelRegistry()
    registry.load("risk", 1, constant(1.0))
    with registry.lease("risk") as model:
        pass
    registry.close()
    registry.close()
    assert model.state is lc.ModelState.DISPOSED and registry.status() == ()
    with pytest.raises(lc.ClosedError, match="is closed"):
        registry.predict("risk", X)


def test_unload_with_wait_waits_also_for_a_version_already_retiring(registry):
    registry.load("risk", 1, constant(1.0))
    registry.load("risk", 2, constant(2.0))
    registry.promote("risk", 2)
    holding, release = threading.Event(), threading.Event()

    def hold():
        with registry.lease("risk", version=1):
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(30), "the lease was not taken"
    registry.unload("risk", 1)  # retiring: a lease is held
    threading.Timer(0.2, release.set).start()
    started = time.monotonic()
    registry.unload("risk", 1, wait=True)
    assert time.monotonic() - started >= 0.15
    assert [s.version for s in registry.status()] == [2]
    joined(holder)
