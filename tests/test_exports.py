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
