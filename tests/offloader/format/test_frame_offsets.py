"""The frame parser's two paths agree. ``_equal_frames`` checks frames that all have the
first one's size with a few strided slice comparisons (no Python step per entry);
``_each_frame`` walks them one at a time. On any bytes, for any count, first id and end,
``_frame_offsets`` (fast path first, the loop when it steps aside) gives what the loop alone
gives: the same offsets and end, or the same FormatError, word for word and offset for
offset. So a damaged frame is named exactly as before the fast path existed.

Profiles ("ci" derandomized, "dev" larger) live in this directory's conftest.py.
"""

from __future__ import annotations

import random
import struct
from array import array
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fixtures.damage import at_fraction, flipped, masks, positions
from offloader.exceptions import FormatError
from offloader.format import PADDING
from offloader.format.parsing import _each_frame, _equal_frames, _frame_offsets

INT64_MAX = 2**63 - 1
ORIGIN = 1000  # where data[0] sits in the object: errors name origin + position


def frame(size: int, entry_id: int, rng: random.Random) -> bytes:
    """One frame; an id beyond int64 is written wrapped, as garbage would hold it."""
    wrapped = (entry_id + 2**63) % 2**64 - 2**63
    return struct.pack(">iq", size, wrapped) + rng.randbytes(size)


@st.composite
def framed(draw: st.DrawFn) -> dict[str, Any]:
    """Frames of one size (sometimes one frame of another size), ids from ``first_id``
    (near both ends of int64 too), behind a prefix and before padding-like or random
    bytes; the parse asked for ``count`` frames (sometimes more or fewer than there are)
    up to ``end`` (sometimes short of the frames); sometimes one byte flipped, anywhere or
    in a frame header."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    size = draw(st.integers(0, 40))
    n = draw(st.integers(1, 30))
    sizes = [size] * n
    if draw(st.booleans()):  # one frame of another size: the loop's job
        sizes[draw(st.integers(0, n - 1))] = draw(st.integers(0, 40))
    first_id = draw(
        st.one_of(
            st.integers(0, 1000),
            st.integers(INT64_MAX - 40, INT64_MAX),
            st.integers(-(2**63), -(2**63) + 40),
        )
    )
    prefix = rng.randbytes(draw(st.integers(0, 20)))
    body = b"".join(frame(s, first_id + i, rng) for i, s in enumerate(sizes))
    tail_len = draw(st.integers(0, 30))
    tail = (PADDING * 8)[:tail_len] if draw(st.booleans()) else rng.randbytes(tail_len)
    data = prefix + body + tail
    frames_end = len(prefix) + len(body)
    end = draw(st.sampled_from([frames_end, len(data), max(len(prefix), frames_end - 1)]))
    count = draw(st.sampled_from([n, n, n - 1, n + 1]))
    damage = draw(st.sampled_from([None, "anywhere", "header"]))
    if damage == "anywhere":
        data = flipped(data, at_fraction(data, draw(positions)), draw(masks))
    elif damage == "header":  # one byte of one frame's length or id: what the slices check
        i, k = draw(st.integers(0, n - 1)), draw(st.integers(0, 11))
        data = flipped(data, len(prefix) + sum(12 + s for s in sizes[:i]) + k, draw(masks))
    return {
        "data": memoryview(data) if draw(st.booleans()) else data,
        "pos": len(prefix),
        "count": count,
        "first_id": first_id,
        "end": end,
        "clean": damage is None and len(set(sizes)) == 1 and count == n and end >= frames_end,
        "fits_int64": first_id + count - 1 <= INT64_MAX,
    }


Parse = Callable[..., int]


def outcome(parse: Parse, case: dict[str, Any]) -> tuple[object, ...]:
    """What a parse gives: its end and the offsets it appended (to arrays that already
    hold a value, as a range's arrays do after its first chunk), or its error."""
    starts, lengths = array("q", [7]), array("q", [9])
    args = (case["data"], case["pos"], case["count"], case["first_id"], case["end"])
    try:
        stop = parse(*args, "in chunk at offset 5", ORIGIN, starts, lengths)
    except FormatError as err:
        return ("refused", str(err), err.offset)
    return ("parsed", stop, starts.tolist(), lengths.tolist())


@given(framed())
@example(  # the ids run past int64: no frame can hold them
    {
        "data": frame(0, INT64_MAX, random.Random(1)) + frame(0, INT64_MAX + 1, random.Random(1)),
        "pos": 0,
        "count": 2,
        "first_id": INT64_MAX,
        "end": 24,
        "clean": False,
        "fits_int64": False,
    }
)
def test_the_fast_path_gives_what_the_loop_gives(case: dict[str, Any]) -> None:
    loop = outcome(_each_frame, case)
    assert outcome(_frame_offsets, case) == loop


@given(framed())
def test_the_fast_path_takes_equal_frames_and_steps_aside_from_anything_else(
    case: dict[str, Any],
) -> None:
    """It is really used (clean frames of one size never reach the loop), and when it
    declines it appends nothing, leaving the whole parse to the loop."""
    starts, lengths = array("q", [7]), array("q", [9])
    args = (case["data"], case["pos"], case["count"], case["first_id"], case["end"])
    stop = _equal_frames(*args, starts, lengths)
    if case["clean"] and case["fits_int64"]:
        assert stop is not None
    if stop is None:
        assert (starts.tolist(), lengths.tolist()) == ([7], [9])
    else:
        assert outcome(_each_frame, case) == ("parsed", stop, starts.tolist(), lengths.tolist())


def test_the_fast_path_never_reads_outside_its_frames() -> None:
    """Bytes before ``pos`` and from ``end`` on are never looked at: the same frames parse
    the same whatever surrounds them."""
    rng = random.Random(3)
    body = b"".join(frame(10, 5 + i, rng) for i in range(6))
    for before, after in ((b"", b""), (b"\xff" * 9, b"\x00" * 30), (b"\x00" * 3, body)):
        data = before + body + after
        starts, lengths = array("q"), array("q")
        end = len(before) + len(body)
        assert _equal_frames(data, len(before), 6, 5, end, starts, lengths) == end
        assert starts.tolist() == [len(before) + 12 + 22 * i for i in range(6)]
        assert lengths.tolist() == [10] * 6


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_header_byte_of_equal_frames_is_checked(mask: int) -> None:
    """Four frames of 5 bytes, each of the 48 header bytes flipped in turn (and the first
    frame's length made negative, -12 among them: a zero stride): the loop's outcome every
    time, so no header byte goes unchecked."""
    rng = random.Random(4)
    clean = b"\x00" * 3 + b"".join(frame(5, 40 + i, rng) for i in range(4)) + PADDING * 2
    cases = [flipped(clean, 3 + i * 17 + k, mask) for i in range(4) for k in range(12)]
    cases += [clean[:3] + struct.pack(">i", n) + clean[7:] for n in (-1, -12, -13, -(2**31))]
    for data in cases:
        for end in (3 + 68, len(clean)):
            case = {"data": data, "pos": 3, "count": 4, "first_id": 40, "end": end}
            assert outcome(_frame_offsets, case) == outcome(_each_frame, case)
    assert outcome(_frame_offsets, {**case, "data": clean})[0] == "parsed"


def test_no_frames_asked_for_parse_to_where_they_start() -> None:
    starts, lengths = array("q"), array("q")
    data = frame(5, 0, random.Random(5))
    for count in (0, -1):
        assert _frame_offsets(data, 0, count, 0, len(data), "", 0, starts, lengths) == 0
        assert _each_frame(data, 0, count, 0, len(data), "", 0, starts, lengths) == 0
    assert (len(starts), len(lengths)) == (0, 0)
