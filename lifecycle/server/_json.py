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

# The deepest document orjson parses: depths fit in 16 bits.
_ORJSON_DEPTH = 1024
# The bytes scanned per NumPy pass: their temporaries stay small.
_SCAN = 4 * 2**20
# The numbers converted (or written) per call of NumPy (or orjson): as short a
# hold of the GIL as a piece of parsing.
_ELEMENTS = 65536
# Rows converted in one call whatever their size: a row still a list was parsed
# in one piece (loads makes a longer one an array), so a few are a few pieces.
_FEW_ROWS = 16

# The structural bytes, by code; 0 is any other byte.
_OPEN_ARRAY, _OPEN_OBJECT, _CLOSE_ARRAY, _CLOSE_OBJECT, _COMMA, _COLON = 1, 2, 3, 4, 5, 6
_CODES = np.zeros(256, np.int8)
for _byte, _code in zip(b"[{]},:", range(1, 7), strict=True):
    _CODES[_byte] = _code
# How each code changes the nesting depth.
_DELTA = np.array([0, 1, 1, -1, -1, 0, 0], np.int32)
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_BLANK = b" \t\r\n"
_IS_BLANK = np.zeros(256, bool)
_IS_BLANK[list(_BLANK)] = True


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
    max_depth = min(max_depth, _ORJSON_DEPTH)
    view = memoryview(data).cast("B")
    small = len(view) <= PIECE
    if small:
        raw = bytes(view) if not isinstance(data, (bytes, bytearray)) else data
        # Shallow for sure: fewer brackets than levels allowed, in strings or not.
        if raw.count(b"[") + raw.count(b"{") <= max_depth:
            return _whole(view, what)
    structure = _scan(np.frombuffer(view, np.uint8), max_depth, what)
    if small:
        return _whole(view, what)
    return _Pieces(view, structure, what, numbers).value(0, len(view))


def _whole(view: memoryview, what: str) -> Any:
    try:
        return orjson.loads(view)
    except orjson.JSONDecodeError as error:
        raise BadRequestError(f"{what} is not valid JSON: {error}") from None


@attrs.frozen
class _Structure:
    """The structural bytes of a document outside its strings, in order.

    Attributes:
        positions: Each one's offset in the document.
        codes: Each one's code (``_OPEN_ARRAY``...).
        depths: The nesting depth at each one: inside for ``[`` and ``{``,
            outside for ``]`` and ``}`` (so a pair's depths differ by one).
    """

    positions: np.ndarray
    codes: np.ndarray
    depths: np.ndarray


def _scan(data: np.ndarray, max_depth: int, what: str) -> _Structure:
    """Find the structural bytes outside strings, refusing a document nested too deep.

    A quote ends or starts a string unless an odd run of backslashes escapes
    it; a byte is outside every string if an even number of such quotes
    precede it. Chunk by chunk, carrying whether a string is open, the run of
    backslashes ending the chunk and the depth.
    """
    positions, codes, depths = [], [], []
    in_string, slashes, depth = 0, 0, 0
    offsets = np.int32 if len(data) < 2**31 else np.int64
    for start in range(0, len(data), _SCAN):
        chunk = data[start : start + _SCAN]
        quotes = np.flatnonzero(chunk == _QUOTE)
        if quotes.size:
            quotes = quotes[~_escaped(chunk, quotes, slashes)]
        found = np.flatnonzero(_CODES[chunk])
        if found.size and quotes.size:
            outside = (np.searchsorted(quotes, found) + in_string) % 2 == 0
            found = found[outside]
        elif in_string:  # the chunk is inside one string
            found = found[:0]
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
        slashes = _trailing_slashes(chunk, slashes)
    if not positions:
        return _Structure(np.zeros(0, offsets), np.zeros(0, np.int8), np.zeros(0, np.int16))
    return _Structure(np.concatenate(positions), np.concatenate(codes), np.concatenate(depths))


def _escaped(chunk: np.ndarray, quotes: np.ndarray, carry: int) -> np.ndarray:
    """Which ``quotes`` (offsets in ``chunk``) an odd run of backslashes escapes.

    ``carry`` is the run of backslashes that ended the previous chunk.
    """
    escaped = np.zeros(quotes.size, bool)
    if quotes[0] == 0:
        escaped[0] = carry % 2 == 1
    inner = quotes[quotes > 0]
    after = inner[chunk[inner - 1] == _BACKSLASH]
    if after.size:  # rare: text with escaped quotes
        slash = (chunk == _BACKSLASH).view(np.int8)
        starts = np.flatnonzero(np.diff(slash, prepend=np.int8(0)) == 1)
        first = starts[np.searchsorted(starts, after - 1, side="right") - 1]
        run = after - first + np.where(first == 0, carry, 0)
        escaped[np.searchsorted(quotes, after)] = run % 2 == 1
    return escaped


def _trailing_slashes(chunk: np.ndarray, carry: int) -> int:
    """The run of backslashes that ends ``chunk`` (with ``carry`` if it is all of them)."""
    if not chunk.size or chunk[-1] != _BACKSLASH:
        return 0
    other = np.flatnonzero(chunk[::-1] != _BACKSLASH)
    return int(other[0]) if other.size else len(chunk) + carry


class _Pieces:
    """A document parsed in pieces along its structure (see :func:`_scan`)."""

    def __init__(self, view: memoryview, structure: _Structure, what: str, numbers: bool) -> None:
        self._view = view
        self._numbers = numbers
        self._positions = structure.positions
        self._codes = structure.codes
        self._depths = structure.depths
        self._what = what

    def value(self, start: int, end: int) -> Any:
        """The value in ``[start, end)``, which may have blanks around it."""
        if end - start <= PIECE:
            return self._loads(start, end)
        lo, hi = (int(i) for i in np.searchsorted(self._positions, (start, end)))
        if lo == hi:  # no structure: one long string or number
            return self._loads(start, end)
        opener, closer = int(self._positions[lo]), int(self._positions[hi - 1])
        code, depth = int(self._codes[lo]), int(self._depths[lo])
        inside = slice(lo + 1, hi - 1)
        whole = (
            code in (_OPEN_ARRAY, _OPEN_OBJECT)
            and self._codes[hi - 1] == code + 2
            and self._depths[hi - 1] == depth - 1
            and (lo + 1 == hi - 1 or int(self._depths[inside].min()) >= depth)
            and _blank(self._view[start:opener])
            and _blank(self._view[closer + 1 : end])
        )
        if not whole:
            if code in (_OPEN_ARRAY, _OPEN_OBJECT) and _blank(self._view[start:opener]):
                # Not one array or object: said without parsing what comes before.
                raise BadRequestError(
                    f"{self._what} is not valid JSON: the array or object at byte {opener} "
                    "is not closed where the value ends, or something follows it."
                )
            return self._loads(start, end)  # a long string or number: orjson says what is wrong
        commas = (self._depths[inside] == depth) & (self._codes[inside] == _COMMA)
        bounds = np.concatenate(([opener], self._positions[inside][commas], [closer]))
        if len(bounds) == 2 and lo + 1 == hi - 1 and _blank(self._view[opener + 1 : closer]):
            return [] if code == _OPEN_ARRAY else {}
        if code == _OPEN_ARRAY:
            return self._array(bounds)
        members: dict[str, Any] = {}
        for first, last, alone in _groups(bounds):
            if alone:
                key, member = self._member(first, last, depth)
                members[key] = member
            else:
                members.update(self._run(first, last, b"{", b"}"))
        return members

    def _array(self, bounds: np.ndarray) -> Any:
        """An array's items, from its brackets and commas; with ``numbers``, maybe an array."""
        parts: list[Any] = []  # lists of items, or NumPy arrays of items (with numbers)
        numbers = self._numbers
        for first, last, alone in _groups(bounds):
            if alone:
                item = self.value(first, last)
                parts.append(item[None] if isinstance(item, np.ndarray) else [item])
                continue
            items = self._run(first, last, b"[", b"]")
            if numbers:
                block = _numbers(items)
                numbers = block is not None
                parts.append(items if block is None else block)
            else:
                parts.append(items)
        blocks = all(isinstance(part, np.ndarray) for part in parts)
        if blocks and len({part.shape[1:] for part in parts}) == 1:
            return np.concatenate(parts)
        items = []
        for part in parts:  # ragged, or not all numbers: lists, as orjson gives
            items.extend(part.tolist() if isinstance(part, np.ndarray) else part)
        return items

    def _member(self, start: int, end: int, depth: int) -> tuple[str, Any]:
        """One long ``"key": value`` of an object whose inside is ``depth`` deep."""
        lo, hi = np.searchsorted(self._positions, (start, end))
        colons = np.flatnonzero((self._depths[lo:hi] == depth) & (self._codes[lo:hi] == _COLON))
        if not colons.size:
            raise BadRequestError(
                f"{self._what} is not valid JSON: an object's member has no ':' (byte {start})."
            )
        colon = int(self._positions[lo + colons[0]])
        key = self._loads(start, colon)
        if not isinstance(key, str):
            raise BadRequestError(
                f"{self._what} is not valid JSON: an object's key is not a string (byte {start})."
            )
        return key, self.value(colon + 1, end)

    def _run(self, start: int, end: int, before: bytes, after: bytes) -> Any:
        """A run of items between commas, parsed inside ``before`` and ``after``."""
        items = self._loads(start, end, before, after)
        if not items:  # only blanks between two commas
            raise BadRequestError(
                f"{self._what} is not valid JSON: an empty item between commas (byte {start})."
            )
        return items

    def _loads(self, start: int, end: int, before: bytes = b"", after: bytes = b"") -> Any:
        piece = self._view[start:end]
        if before:
            piece = before + piece + after  # type: ignore[assignment]
        try:
            return orjson.loads(piece)
        except orjson.JSONDecodeError as error:
            raise BadRequestError(
                f"{self._what} is not valid JSON: {error.msg} (near byte "
                f"{start + max(error.pos - len(before), 0)})."
            ) from None


def _groups(bounds: np.ndarray) -> Iterator[tuple[int, int, bool]]:
    """The items between ``bounds`` (the container's brackets and commas), in pieces.

    Yields ``(start, end, alone)``: an item longer than :data:`PIECE` alone
    (``alone``: parse it along its own structure), else a run of short
    items of about :data:`PIECE` bytes, without the brackets around them.
    """
    sizes = np.diff(bounds)
    long = np.flatnonzero(sizes > PIECE).tolist()
    done = 0
    for index in [*long, len(sizes)]:
        if index > done:  # the short items done..index-1, in runs
            run = bounds[done : index + 1]
            targets = np.arange(int(run[0]) + PIECE, int(run[-1]), PIECE)
            cuts = np.unique(np.searchsorted(run, targets)).tolist()
            edges = [0, *(c for c in cuts if 0 < c < len(run) - 1), len(run) - 1]
            for a, b in itertools.pairwise(edges):
                yield int(run[a]) + 1, int(run[b]), False
        if index < len(sizes):
            yield int(bounds[index]) + 1, int(bounds[index + 1]), True
        done = index + 1


def _numbers(items: list[Any]) -> np.ndarray | None:
    """``items`` as an array if they are numbers, or arrays of numbers of one shape."""
    try:
        block = np.asarray(items)
    except (ValueError, TypeError, OverflowError):
        return None
    return block if block.dtype.kind in "biuf" else None


def _blank(view: memoryview) -> bool:
    if len(view) <= 4096:
        return not bytes(view).strip(_BLANK)
    return bool(_IS_BLANK[np.frombuffer(view, np.uint8)].all())  # without the GIL


def as_array(values: Any, dtype: np.dtype | None = None) -> np.ndarray | None:
    """Rows of numbers (nested lists, or an array :func:`loads` made) as one array.

    Lists are converted a block of rows per NumPy call.

    Args:
        values: The rows (the first dimension).
        dtype: Convert to this dtype when the values allow it as a model's
            input would (integers to any number; floats to floats only).

    Returns:
        The array; ``None`` if the rows are not numbers of one shape (strings,
        ragged rows, integers past 64 bits): the caller then passes them on,
        and the model's input check says what is wrong with them.
    """
    if isinstance(values, np.ndarray):
        parts = [values] if values.dtype.kind in "biuf" else None
    elif isinstance(values, list) and values:
        parts = _blocks(values)
    else:
        parts = None
    if parts is None:
        return None
    found = np.result_type(*parts)
    # Floats stay floats for an integer input, which refuses them.
    target = found
    if (
        dtype is not None
        and dtype.kind in "biuf"
        and not (found.kind == "f" and dtype.kind in "iu")
    ):
        target = dtype
    if len(parts) == 1:
        return parts[0].astype(target, copy=False)  # casts without the GIL
    out = np.empty((sum(len(part) for part in parts), *parts[0].shape[1:]), target)
    offset = 0
    for part in parts:  # a copy that casts, without the GIL
        out[offset : offset + len(part)] = part
        offset += len(part)
    return out


def _blocks(values: list[Any]) -> list[np.ndarray] | None:
    """``values`` as arrays of a block of rows each, or ``None`` if they are not numbers."""
    if len(values) <= _FEW_ROWS:  # most requests: one call
        block = _numbers(values)
        return None if block is None else [block]
    try:
        head = np.asarray(values[0])
    except (ValueError, TypeError, OverflowError):
        return None
    step = max(1, _ELEMENTS // max(1, head.size))
    blocks = []
    for first in range(0, len(values), step):
        block = _numbers(values[first : first + step])
        if block is None or block.shape[1:] != head.shape:
            return None
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

    :class:`LazyList`, long lists and NumPy arrays are written in pieces of
    about :data:`_ELEMENTS` numbers, each one orjson call, and so are the
    members of dicts and the items of lists that hold them; anything else in
    one call.
    """
    if not _long(value):  # most answers: one call
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    parts: list[bytes] = []
    _dump(value, parts)
    return b"".join(parts)


def _long(value: Any) -> bool:
    """Whether ``value`` holds something :func:`dumps` writes in pieces."""
    if isinstance(value, LazyList):
        return True
    if isinstance(value, np.ndarray):
        return value.size > _ELEMENTS
    if isinstance(value, dict):
        return any(_long(item) for item in value.values())
    if isinstance(value, list):
        return len(value) > _ELEMENTS or any(
            _long(item) for item in value if isinstance(item, _CONTAINERS)
        )
    return False


def _dump(value: Any, parts: list[bytes]) -> None:
    if isinstance(value, dict):
        parts.append(b"{")
        for index, (key, item) in enumerate(value.items()):
            parts.append(b"," if index else b"")
            parts += (orjson.dumps(key), b":")
            _dump(item, parts)
        parts.append(b"}")
    elif isinstance(value, LazyList):
        _dump_pieces(value.length, value.make, value.step, parts)
    elif isinstance(value, np.ndarray) and value.ndim and value.size > _ELEMENTS:
        _dump_pieces(len(value), _slicer(value), step_for(value[0].size), parts)
    elif isinstance(value, list) and len(value) > _ELEMENTS:
        _dump_pieces(len(value), _slicer(value), _ELEMENTS, parts)
    elif isinstance(value, list) and any(isinstance(item, _CONTAINERS) for item in value):
        parts.append(b"[")  # a v2 answer's outputs: each may hold a long array
        for index, item in enumerate(value):
            parts.append(b"," if index else b"")
            _dump(item, parts)
        parts.append(b"]")
    else:
        parts.append(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


_CONTAINERS = (dict, list, np.ndarray, LazyList)


def _slicer(items: Any) -> Callable[[int, int], Any]:
    return lambda start, stop: items[start:stop]


def _dump_pieces(
    length: int, make: Callable[[int, int], Any], step: int, parts: list[bytes]
) -> None:
    parts.append(b"[")
    for first in range(0, length, step):
        piece = orjson.dumps(make(first, first + step), option=orjson.OPT_SERIALIZE_NUMPY)
        parts += (b"," if first else b"", piece[1:-1])
    parts.append(b"]")
