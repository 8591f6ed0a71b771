"""lifecycle.server._json: JSON parsed and written in bounded pieces, no deeper than a limit.

The pieces are made tiny here (a few bytes) so that every document splits
everywhere it can: at each comma of each array and object, across the scan's
chunk boundaries, in the middle of escapes. Whatever the split, the result is
orjson's for the whole document, or the library's error for bad input.
"""

from __future__ import annotations

import contextlib
import gc
import json
import threading
import time
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzzing import FUZZ

from lifecycle.server import _json
from lifecycle.server._errors import BadRequestError


@contextlib.contextmanager
def tiny_pieces() -> Iterator[None]:
    """Pieces of 8 bytes, scanned 3 bytes at a time (a context: hypothesis reruns tests)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_json, "PIECE", 8)
        patch.setattr(_json, "_SCAN", 3)
        yield


def as_lists(value):
    """``value`` with NumPy arrays as the lists they were parsed from."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        # An array stands for a whole list of numbers, never for one item of a list.
        assert not any(isinstance(item, np.ndarray) for item in value), value
        return [as_lists(item) for item in value]
    if isinstance(value, dict):
        return {key: as_lists(item) for key, item in value.items()}
    return value


def parsed(data: bytes, **options) -> tuple[str, object]:
    """``("ok", value)`` or ``("error", message)``: for orjson, ``_json.loads`` otherwise."""
    try:
        if options.pop("orjson", False):
            return "ok", orjson.loads(data)
        return "ok", as_lists(_json.loads(data, 10_000, "The body", **options))
    except orjson.JSONDecodeError as error:
        return "error", str(error)
    except BadRequestError as error:
        assert str(error).startswith("The body "), error
        return "error", str(error)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet='ab"\\[]{},: \u00e9\n/'),
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(st.text(alphabet='k"\\[:,}', max_size=4), children, max_size=5)
    ),
    max_leaves=40,
)


@FUZZ
@given(value=JSON_VALUES, indent=st.sampled_from([None, 0, 2]), numbers=st.booleans())
def test_a_document_in_pieces_is_orjsons_whole(value, indent, numbers):
    data = json.dumps(value, indent=indent, ensure_ascii=False).encode()
    with tiny_pieces():
        assert parsed(data, numbers=numbers) == ("ok", orjson.loads(data))


@FUZZ
@given(
    value=JSON_VALUES,
    edits=st.lists(
        st.tuples(st.integers(0, 10_000), st.sampled_from(list(b'[]{},:"\\ 1a\x00\xff'))),
        min_size=1,
        max_size=3,
    ),
)
def test_a_damaged_document_in_pieces_is_refused_as_orjson_refuses_it(value, edits):
    data = bytearray(json.dumps(value).encode())
    for where, byte in edits:
        data.insert(where % (len(data) + 1), byte)
    want = parsed(bytes(data), orjson=True)
    with tiny_pieces():
        got = parsed(bytes(data))
    assert got[0] == want[0], (bytes(data), want, got)
    if want[0] == "ok":
        assert got == want


@FUZZ
@given(data=st.binary(max_size=200))
def test_any_bytes_give_a_value_or_the_librarys_error(data):
    with tiny_pieces():
        assert parsed(data)[0] == parsed(data, orjson=True)[0]


def test_escaped_quotes_and_backslash_runs_across_chunk_boundaries():
    with tiny_pieces():
        check_texts()


def check_texts() -> None:
    for text in ['a\\"b', "\\\\", '\\\\"', '"[', "\\\\\\[", "]}\\,:"]:
        data = json.dumps({"k": [text, 1, {text: [text]}], text: text}).encode()
        assert parsed(data) == ("ok", orjson.loads(data)), data


@pytest.mark.parametrize(("depth", "fits"), [(1, True), (64, True), (65, False), (1000, False)])
def test_depth_beyond_the_limit_is_refused_before_parsing(depth, fits):
    data = b"[" * depth + b"1" + b"]" * depth
    if fits:
        assert _json.loads(data, 64, "The body") is not None
        return
    with pytest.raises(BadRequestError) as refused:
        _json.loads(data, 64, "The body")
    assert str(refused.value) == (
        "The body nests arrays and objects deeper than 64 levels (at byte 64); this server "
        "takes at most 64 (--max_json_depth)."
    )


def test_brackets_in_strings_do_not_count_as_depth():
    assert _json.loads(b'["' + b"[" * 100 + b'"]', 2, "The body") == ["[" * 100]
    assert _json.loads(b'{"a\\"[[[": "]]"}', 1, "The body") == {'a"[[[': "]]"}


def test_with_numbers_long_arrays_of_numbers_come_as_arrays():
    with tiny_pieces():
        check_numbers()


def check_numbers() -> None:
    rows = np.arange(24).reshape(6, 2, 2)
    document = {"instances": rows.tolist(), "names": ["a", "b", "c", "d", "e", "f"], "n": 3}
    got = _json.loads(orjson.dumps(document), 64, "The body", numbers=True)
    assert isinstance(got["instances"], np.ndarray) and got["instances"].dtype == np.int64
    np.testing.assert_array_equal(got["instances"], rows)
    assert got["names"] == document["names"] and got["n"] == 3
    # Ragged rows, or numbers and strings mixed, stay lists as orjson gives them.
    for odd in ([[1, 2], [3]] * 5, [1, 2, 3, "x"] * 4, [1.5, None] * 8):
        data = orjson.dumps({"x": odd})
        assert _json.loads(data, 64, "The body", numbers=True) == {"x": odd}


def test_as_array_converts_rows_in_blocks_to_the_inputs_dtype(monkeypatch):
    monkeypatch.setattr(_json, "_ELEMENTS", 4)
    rows = [[1, 2], [3, 4], [5, 6.5]]
    converted = _json.as_array(rows, np.dtype("float32"))
    assert converted.dtype == np.float32
    np.testing.assert_array_equal(converted, np.asarray(rows, "float32"))
    # Floats stay floats for an integer input (which refuses them); integers take any dtype.
    assert _json.as_array(rows, np.dtype("int64")).dtype == np.float64
    assert _json.as_array([[1], [2]], np.dtype("int8")).dtype == np.int8
    for odd in ([[1, 2], [3]], [["a"], ["b"]], [], [{"b64": "AA=="}], [[2**70]]):
        assert _json.as_array(odd, np.dtype("float32")) is None, odd


def test_dumps_writes_long_arrays_in_pieces_as_one_document(monkeypatch):
    monkeypatch.setattr(_json, "_ELEMENTS", 3)
    array = np.arange(10, dtype=np.float32).reshape(5, 2) / 4
    made: list[tuple[int, int]] = []

    def make(start: int, stop: int) -> list[int]:
        made.append((start, stop))
        return list(range(start, min(stop, 7)))

    value = {"a": array, "b": list(range(8)), "c": _json.LazyList(7, make, 3), "d": [], "e": "x"}
    assert orjson.loads(_json.dumps(value)) == {
        "a": array.tolist(),
        "b": list(range(8)),
        "c": list(range(7)),
        "d": [],
        "e": "x",
    }
    assert made == [(0, 3), (3, 6), (6, 9)]


def test_a_long_document_holds_the_gil_a_piece_at_a_time():
    """orjson parsing 8 MiB of rows in one call kept every other thread waiting ~0.1 s or more."""
    rows = np.random.randint(0, 256, (1200, 28, 28, 1))
    data = orjson.dumps({"instances": rows}, option=orjson.OPT_SERIALIZE_NUMPY)
    gaps: list[float] = []
    done = threading.Event()

    def tick() -> None:
        while not done.is_set():
            start = time.perf_counter()
            time.sleep(0.001)
            gaps.append(time.perf_counter() - start)

    ticker = threading.Thread(target=tick)
    # As lifecycle serve's heap is (freeze_heap): collections skip what TensorFlow
    # made at import, which would take this process's collector a tenth of a second.
    gc.collect()
    gc.freeze()
    ticker.start()
    try:
        got = _json.loads(data, 64, "The body", numbers=True)
    finally:
        done.set()
        ticker.join()
        gc.unfreeze()
    np.testing.assert_array_equal(got["instances"], rows)
    # Pieces of 256 KiB take ~3 ms each; a whole-document parse took 0.4 s here.
    assert max(gaps) < 0.1, max(gaps)
