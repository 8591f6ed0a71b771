from __future__ import annotations

import types

import lifecycle as lc


def test_all_is_complete_without_duplicates():
    # ruff's RUF022 keeps __all__ sorted; this checks it lists exactly the public names.
    assert len(lc.__all__) == len(set(lc.__all__))
    public = {
        name
        for name, value in vars(lc).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(lc.__all__)


def test_every_public_name_is_documented():
    for name in lc.__all__:
        value = getattr(lc, name)
        if callable(value):
            assert value.__doc__, name


def test_the_integrations_export_their_modules_names_documented():
    import importlib

    import pytest

    pytest.importorskip("keras_tuner")
    pytest.importorskip("sklearn")
    import lifecycle.integrations as integrations

    assert len(integrations.__all__) == len(set(integrations.__all__))
    modules = [
        importlib.import_module(f"lifecycle.integrations.{name}")
        for name in ("keras_tuner", "sklearn")
    ]
    assert sorted(integrations.__all__) == sorted(n for m in modules for n in m.__all__)
    for name in integrations.__all__:
        value = getattr(integrations, name)
        assert value is next(getattr(m, name) for m in modules if name in m.__all__)
        assert value.__doc__, name
    with pytest.raises(AttributeError, match="has no attribute 'Tuner'"):
        integrations.Tuner  # noqa: B018
