"""JSON bodies decoded and answers encoded in bounded pieces, no deeper than a limit.

orjson parses a whole document in one C call that holds the GIL: no other
thread (the event loop answering health checks) runs meanwhile, for longer the
larger the body (docs/serving.md, "Limits"). :func:`loads` first finds the
document's structure with NumPy over the raw bytes (a few MiB per call, most of
them without the GIL), then hands orjson pieces of at most about
:data:`PIECE` bytes and assembles what it returns: the values orjson gives for
the whole document, with Python code between the pieces, which lets other
threads run. The same scan measures how deep the document nests, so a body
nested deeper than the server takes is refused before anything is parsed
(Python code recursing through a document a thousand levels deep raised
``RecursionError``).

:func:`as_array` turns nested lists of numbers into an array a block of rows
at a time (``np.asarray`` of a whole list holds the GIL as long as orjson), and
:func:`dumps` writes an answer a block of items at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np
import orjson

from ._errors import BadRequestError

__all__ = ["PIECE", "LazyList", "as_array", "dumps", "loads"]

#: The most bytes of JSON that orjson parses in one call: short enough a hold of
#: the GIL that the event loop runs between pieces.
PIECE = 256 * 1024

# The bytes scanned per NumPy pass: their temporaries stay small.
_SCAN = 4 * 2**20
# The numbers converted (or written) per call of NumPy (or orjson): as short a
# hold of the GIL as a piece of parsing.
_ELEMENTS = 65536
# Rows converted in one call whatever their size (most requests: all of them):
# a row still a list was parsed in one piece (loads makes a longer one an
# array), so a few are a few pieces.
_FEW_ROWS = 16

# The structural bytes, by code; 0 is any other byte.
_OPEN_ARRAY, _OPEN_OBJECT, _CLOSE_ARRAY, _CLOSE_OBJECT, _COMMA, _COLON = 1, 2, 3, 4, 5, 6
_CODES = np.zeros(256, np.int8)
_CODES[list(b"[{]},:")] = range(1, 7)
# How each code changes the nesting depth.
_DELTA = np.array([0, 1, 1, -1, -1, 0, 0], np.int32)
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_IS_BLANK = np.zeros(256, bool)
_IS_BLANK[list(b" \t\r\n")] = True


def loads(
    data: bytes | bytearray | memoryview, max_depth: int, what: str, *, numbers: bool = False
) -> Any:
    """``data`` parsed as JSON, in pieces of at most about :data:`PIECE` bytes.

    Args:
        data: The JSON document.
        max_depth: The deepest the document may nest arrays and objects
            (``[1]`` is 1 deep).
        what: How error messages name the document ("The request body").
        numbers: Give an array longer than :data:`PIECE` whose items are
            numbers, or arrays of numbers of one shape, as a NumPy array
            (``np.asarray`` of its items), converted a piece at a time: a
            model's input without millions of Python lists in between, which
            the garbage collector would walk, holding the GIL, as they grow.

    Returns:
        What ``orjson.loads(data)`` returns (with ``numbers``, some arrays as
        NumPy arrays).

    Raises:
        BadRequestError: The document is not JSON, or nests deeper than
            ``max_depth``; the message names ``what`` and says which.
    """
    max_depth = min(max_depth, 1024)  # the deepest orjson parses (depths fit in 16 bits)
    view = memoryview(data).cast("B")
    if len(view) > PIECE:
        return _Pieces(view, *_scan(view, max_depth, what), what, numbers).value(0, len(view))
    raw = data if isinstance(data, (bytes, bytearray)) else bytes(view)
    # Shallow for sure: fewer brackets than levels allowed, in strings or not.
    if raw.count(b"[") + raw.count(b"{") > max_depth:
        _scan(view, max_depth, what)
    try:
        return orjson.loads(view)
    except orjson.JSONDecodeError as error:
        raise BadRequestError(f"{what} is not valid JSON: {error}") from None


def _scan(view: memoryview, max_depth: int, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The structural bytes outside strings, refusing a document nested too deep.

    A quote ends or starts a string unless an odd run of backslashes escapes
    it; a byte is outside every string if an even number of the other quotes
    precede it. Chunk by chunk, carrying whether a string is open, the run of
    backslashes ending the chunk and the depth.

    Returns:
        In the order of the document, each structural byte's offset, code
        (``_OPEN_ARRAY``...) and nesting depth: inside for ``[`` and ``{``,
        outside for ``]`` and ``}`` (so a pair's depths differ by one); then
        the document's length, code 0 and depth 0.
    """
    data = np.frombuffer(view, np.uint8)
    offsets = np.int32 if len(data) < 2**31 else np.int64
    positions, codes, depths = [], [], []
    in_string, slashes, depth = 0, 0, 0
    for start in range(0, len(data), _SCAN):
        chunk = data[start : start + _SCAN]
        quotes = np.flatnonzero(chunk == _QUOTE)
        quotes = quotes[_slashes_before(chunk, quotes, slashes) % 2 == 0]
        found = np.flatnonzero(_CODES[chunk])
        found = found[(np.searchsorted(quotes, found) + in_string) % 2 == 0]
        if found.size:
            code = _CODES[chunk[found]]
            level = np.cumsum(_DELTA[code], dtype=np.int32) + depth
            if int(level.max()) > max_depth:
                where = start + int(found[np.argmax(level > max_depth)])
                raise BadRequestError(
                    f"{what} nests arrays and objects deeper than {max_depth} levels (at byte "
                    f"{where}); this server takes at most {max_depth} (--max_json_depth)."
                )
            if int(level.min()) < 0:
                where = start + int(found[np.argmax(level < 0)])
                raise BadRequestError(
                    f"{what} is not valid JSON: it closes a bracket it never opened (byte {where})."
                )
            depth = int(level[-1])
            # Small types: a structural byte every few bytes of a body of numbers.
            positions.append((found + start).astype(offsets))
            codes.append(code)
            depths.append(level.astype(np.int16))  # 0..max_depth
        in_string = (in_string + quotes.size) % 2
        slashes = int(_slashes_before(chunk, np.array([len(chunk)]), slashes)[0])
    # One more past the end: a search of the structure always finds one.
    return (
        np.concatenate([*positions, [len(data)]], dtype=offsets),
        np.concatenate([*codes, [0]], dtype=np.int8),
        np.concatenate([*depths, [0]], dtype=np.int16),
    )


def _slashes_before(chunk: np.ndarray, ends: np.ndarray, carry: int) -> np.ndarray:
    """How many backslashes run up to each of ``ends`` (ascending offsets in ``chunk``).

    ``carry`` is the run of backslashes that ended the previous chunk.
    """
    runs = np.where(ends == 0, carry, 0)
    after = ends[(ends > 0) & (chunk[ends - 1] == _BACKSLASH)]
    if after.size:  # rare: text with escapes
        slash = (chunk == _BACKSLASH).view(np.int8)
        starts = np.flatnonzero(np.diff(slash, prepend=np.int8(0)) == 1)
        first = starts[np.searchsorted(starts, after - 1, side="right") - 1]
        runs[np.searchsorted(ends, after)] = after - first + np.where(first == 0, carry, 0)
    return runs


@attrs.frozen
class _Pieces:
    """A document parsed in pieces along its structure (the arrays of :func:`_scan`)."""

    view: memoryview
    positions: np.ndarray
    codes: np.ndarray
    depths: np.ndarray
    what: str
    numbers: bool

    def value(self, start: int, end: int) -> Any:
        """The value in ``[start, end)``, which may have blanks around it.

        ``end`` is a structural byte's offset (a comma or a closer) or the
        document's end.
        """
        lo, hi = (int(i) for i in np.searchsorted(self.positions, (start, end)))
        opener, closer = int(self.positions[lo]), int(self.positions[hi - 1])
        code, depth = int(self.codes[lo]), int(self.depths[lo])
        # With no structure within (lo == hi), the entry at lo is the comma or
        # closer at ``end``, or the one past the document's end: no opener.
        if (
            end - start <= PIECE
            or code not in (_OPEN_ARRAY, _OPEN_OBJECT)
            or not _blank(self.view[start:opener])
        ):
            return self._loads(start, end)  # orjson says what is wrong, if anything is
        inside = slice(lo + 1, hi - 1)
        if not (
            self.codes[hi - 1] == code + 2
            and self.depths[hi - 1] == depth - 1
            and np.all(self.depths[inside] >= depth)
            and _blank(self.view[closer + 1 : end])
        ):
            # Not one array or object: said without parsing what comes before.
            raise BadRequestError(
                f"{self.what} is not valid JSON: the array or object at byte {opener} "
                "is not closed where the value ends, or something follows it."
            )
        commas = (self.depths[inside] == depth) & (self.codes[inside] == _COMMA)
        bounds = np.concatenate(([opener], self.positions[inside][commas], [closer]))
        if len(bounds) == 2 and lo + 1 == hi - 1 and _blank(self.view[opener + 1 : closer]):
            return [] if code == _OPEN_ARRAY else {}
        if code == _OPEN_ARRAY:
            return self._array(bounds)
        members: dict[str, Any] = {}
        for first, last, alone in _groups(bounds):
            if alone:
                members.update(self._member(first, last, depth))
            else:
                members.update(self._loads(first, last, b"{", b"}"))
        return members

    def _array(self, bounds: np.ndarray) -> Any:
        """An array's items, from its brackets and commas; with ``numbers``, maybe an array."""
        parts: list[Any] = []  # lists of items, or NumPy arrays of items (with numbers)
        numbers = self.numbers
        for first, last, alone in _groups(bounds):
            if alone:
                item = self.value(first, last)
                items = item[None] if isinstance(item, np.ndarray) else [item]
                numbers = numbers and isinstance(item, np.ndarray)
            else:
                items = self._loads(first, last, b"[", b"]")
            block = _numbers(items) if numbers else None
            numbers = block is not None
            parts.append(items if block is None else block)
        if numbers and len({part.shape[1:] for part in parts}) == 1:  # all parts are arrays
            return np.concatenate(parts)
        items = []
        for part in parts:  # ragged, or not all numbers: lists, as orjson gives
            items.extend(part.tolist() if isinstance(part, np.ndarray) else part)
        return items

    def _member(self, start: int, end: int, depth: int) -> dict[str, Any]:
        """One long ``"key": value`` of an object whose inside is ``depth`` deep."""
        lo, hi = np.searchsorted(self.positions, (start, end))
        colons = np.flatnonzero((self.depths[lo:hi] == depth) & (self.codes[lo:hi] == _COLON))
        if not colons.size:  # not a member: orjson says what is wrong
            return self._loads(start, end, b"{", b"}")
        colon = int(self.positions[lo + colons[0]])
        # Parsed as {key: 0}: orjson checks that the key is a string.
        (key,) = self._loads(start, colon + 1, b"{", b"0}")
        return {key: self.value(colon + 1, end)}

    def _loads(self, start: int, end: int, before: bytes = b"", after: bytes = b"") -> Any:
        """``[start, end)`` parsed, between ``before`` and ``after`` if given.

        With them, it is a run of items, or a member's key: never nothing.
        """
        piece = self.view[start:end]
        if before:
            piece = before + piece + after  # type: ignore[assignment]
        try:
            value = orjson.loads(piece)
        except orjson.JSONDecodeError as error:
            raise BadRequestError(
                f"{self.what} is not valid JSON: {error.msg} (near byte "
                f"{start + max(error.pos - len(before), 0)})."
            ) from None
        if before and not value:  # only blanks between two commas
            raise BadRequestError(
                f"{self.what} is not valid JSON: an empty item between commas (byte {start})."
            )
        return value


def _groups(bounds: np.ndarray) -> Iterator[tuple[int, int, bool]]:
    """The items between ``bounds`` (the container's brackets and commas), in pieces.

    Yields ``(start, end, alone)``: an item longer than :data:`PIECE` alone
    (``alone``: parse it along its own structure), else a run of short
    items of about :data:`PIECE` bytes, without the brackets around them.
    """
    sizes = np.diff(bounds)
    long = np.flatnonzero(sizes > PIECE)
    targets = np.searchsorted(bounds, np.arange(int(bounds[0]) + PIECE, int(bounds[-1]), PIECE))
    cuts = np.unique(np.concatenate(([0, len(sizes)], targets, long, long + 1)))
    for a, b in itertools.pairwise(cuts.tolist()):
        yield int(bounds[a]) + 1, int(bounds[b]), b == a + 1 and bool(sizes[a] > PIECE)


def _numbers(items: list[Any]) -> np.ndarray | None:
    """``items`` as an array if they are numbers, or arrays of numbers of one shape."""
    try:
        block = np.asarray(items)
    except (ValueError, TypeError, OverflowError):
        return None
    return block if block.dtype.kind in "biuf" else None


def _blank(view: memoryview) -> bool:
    """Whether ``view`` holds only JSON's blanks (or nothing)."""
    return bool(_IS_BLANK[np.frombuffer(view, np.uint8)].all())  # without the GIL


def as_array(values: Any, dtype: np.dtype | None = None) -> np.ndarray | None:
    """Rows of numbers (nested lists, or an array :func:`loads` made) as one array.

    Lists are converted a block of rows per NumPy call (:func:`_blocks`).

    Args:
        values: The rows (the first dimension).
        dtype: Convert to this dtype when the values allow it as a model's
            input would (integers to any number; floats to floats only).

    Returns:
        The array; ``None`` if the rows are not numbers of one shape (strings,
        ragged rows, integers past 64 bits): the caller then passes them on,
        and the model's input check says what is wrong with them.
    """
    parts = _blocks(values)
    if not parts:
        return None
    found = np.result_type(*parts)
    target = dtype if dtype is not None and dtype.kind in "biuf" else found
    if found.kind == "f" and target.kind in "iu":
        target = found  # floats stay floats for an integer input, which refuses it
    if len(parts) == 1:
        return parts[0].astype(target, copy=False)  # casts without the GIL
    return np.concatenate(parts, dtype=target, casting="unsafe")  # one copy that casts


def _blocks(values: Any) -> list[np.ndarray]:
    """``values`` as arrays of a block of rows each; none if they are not numbers of one shape.

    The first block is :data:`_FEW_ROWS` rows; the others about
    :data:`_ELEMENTS` numbers each.
    """
    if isinstance(values, np.ndarray):
        return [values] if values.dtype.kind in "biuf" else []
    head = _numbers(values[:_FEW_ROWS]) if isinstance(values, list) and values else None
    if head is None:
        return []
    step = step_for(head.size // len(head))
    blocks = [head]
    for first in range(len(head), len(values), step):
        block = _numbers(values[first : first + step])
        if block is None or block.shape[1:] != head.shape[1:]:
            return []
        blocks.append(block)
    return blocks


@attrs.frozen
class LazyList:
    """A JSON array of ``length`` items that :func:`dumps` makes ``step`` at a time.

    Attributes:
        length: How many items.
        make: ``make(start, stop)``: the items ``start`` to ``stop`` as a list
            (or anything orjson writes as a JSON array).
        step: How many items to make per call: about :data:`_ELEMENTS` numbers.
    """

    length: int
    make: Callable[[int, int], Any]
    step: int


def step_for(item_size: int) -> int:
    """The items per piece when each holds ``item_size`` numbers."""
    return max(1, _ELEMENTS // max(1, item_size))


def dumps(value: Any) -> bytes:
    """``value`` as JSON (NumPy arrays as nested lists), long arrays a piece at a time.

    :class:`LazyList`, lists longer than :data:`_ELEMENTS` items and NumPy
    arrays of more numbers are written in pieces of about that many numbers,
    each one orjson call, wherever they are in dicts and lists; the rest, and
    those pieces as a list of :class:`orjson.Fragment`, in one call.
    """
    return orjson.dumps(_written(value), option=orjson.OPT_SERIALIZE_NUMPY)


def _written(value: Any) -> Any:
    """``value`` with what :func:`dumps` writes in pieces already written, as fragments."""
    if isinstance(value, dict):
        return {key: _written(item) for key, item in value.items()}
    if isinstance(value, np.ndarray) and value.ndim and value.size > _ELEMENTS:
        value = LazyList(len(value), _slicer(value), step_for(value[0].size))
    elif isinstance(value, list) and len(value) > _ELEMENTS:
        value = LazyList(len(value), _slicer(value), _ELEMENTS)
    elif isinstance(value, list) and any(isinstance(item, _CONTAINERS) for item in value):
        return [_written(item) for item in value]
    if not isinstance(value, LazyList):
        return value
    # Items of the array written, without its brackets: orjson adds them.
    pieces = []
    for first in range(0, value.length, value.step):
        items = value.make(first, first + value.step)
        piece = orjson.dumps(items, option=orjson.OPT_SERIALIZE_NUMPY)
        pieces.append(orjson.Fragment(piece[1:-1]))
    return pieces


_CONTAINERS = (dict, list, np.ndarray, LazyList)


def _slicer(items: Any) -> Callable[[int, int], Any]:
    return lambda start, stop: items[start:stop]
