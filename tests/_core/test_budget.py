"""The registry's budget policy, without TensorFlow: which versions a load evicts."""

from __future__ import annotations

from lifecycle._core import Resident, plan_eviction


def resident(key, *, model="m", nbytes=10, last_used=0.0, **flags):
    return Resident(key=key, model=model, nbytes=nbytes, last_used=last_used, **flags)


def plan(residents, *, model="m", incoming=10, budget=None, cap=None, own_default=False):
    return plan_eviction(
        residents,
        model=model,
        incoming_bytes=incoming,
        incoming_versions=1,
        memory_budget=budget,
        max_loaded=cap,
        evict_own_default=own_default,
    )


def test_a_load_that_fits_evicts_nothing():
    result = plan([resident("a")], budget=20, cap=2)
    assert result.fits and result.victims == ()
    assert (result.resident_bytes, result.versions) == (20, 2)


def test_least_recently_used_goes_first_and_only_as_many_as_needed():
    residents = [
        resident("new", last_used=3.0),
        resident("old", last_used=1.0),
        resident("mid", last_used=2.0),
    ]
    assert plan(residents, budget=20).victims == ("old", "mid")
    assert plan(residents, budget=30).victims == ("old",)
    assert plan(residents, cap=2).victims == ("old", "mid")


def test_pinned_defaults_loading_and_retiring_versions_are_never_evicted():
    residents = [
        resident("labelled", pinned=True),
        resident("default", default=True),
        resident("retiring", ready=False),
        resident("free", last_used=5.0),
    ]
    result = plan(residents, budget=40)
    assert result.fits and result.victims == ("free",)
    refused = plan(residents, budget=20)
    assert not refused.fits and refused.victims == ()
    assert refused.freeable_bytes == 10 and refused.resident_bytes == 50


def test_resource_preserving_may_evict_the_loading_models_own_default_only():
    residents = [
        resident("own", model="m", default=True, last_used=2.0),
        resident("other", model="n", default=True, last_used=1.0),
    ]
    assert not plan(residents, budget=20).fits
    result = plan(residents, budget=20, own_default=True)
    assert result.fits and result.victims == ("own",)
