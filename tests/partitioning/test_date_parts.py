"""memwal_sql.partitioning.date_parts must match DataFusion 55's date_part bit for bit."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memwal_sql.partitioning.date_parts import (
    _MAX_DAY,
    _MIN_DAY,
    _NAMED_OFFSETS,
    PARTS,
    date_part,
    supports,
)
from memwal_sql.partitioning.transforms import _eval_expression

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
DAY_SECONDS = 86_400
PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def datafusion_date_part(arr: pa.Array | pa.ChunkedArray, part: str) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return _eval_expression(f"date_part('{part}', col0)", [arr], len(arr)).cast(pa.int32())


def assert_matches_datafusion(arr: pa.Array | pa.ChunkedArray, part: str) -> pa.Array:
    got = date_part(arr, part)
    expected = datafusion_date_part(arr, part)
    assert got.type == pa.int32()
    assert got.to_pylist() == expected.to_pylist(), (arr.type, part)
    assert got.equals(expected)
    return got


# --------------------------------------------------------------------------------------------
# Property test against DataFusion
# --------------------------------------------------------------------------------------------


@st.composite
def fixed_offsets(draw: st.DrawFn) -> str:
    """Offsets in every form arrow-rs parses, including odd ones like '+05:75'."""
    sign = draw(st.sampled_from("+-"))
    hh = draw(st.integers(0, 23))
    form = draw(st.sampled_from(["HH:MM", "HHMM", "HH"]))
    if form == "HH":
        return f"{sign}{hh:02d}"
    mm = draw(st.integers(0, min(99, (DAY_SECONDS - 1 - hh * 3600) // 60)))
    return f"{sign}{hh:02d}:{mm:02d}" if form == "HH:MM" else f"{sign}{hh:02d}{mm:02d}"


def _edges(per_day: int, lo: int, hi: int) -> list[int]:
    """Values around chrono's limits, the epoch and the physical type's extremes."""
    days = [_MIN_DAY - 1, _MIN_DAY, _MAX_DAY, _MAX_DAY + 1, -1, 0, 1]
    values = {lo, lo + 1, hi - 1, hi}
    for d in days:
        values |= {d * per_day - 1, d * per_day, d * per_day + 1, (d + 1) * per_day - 1}
    return sorted(v for v in values if lo <= v <= hi)


@st.composite
def date_arrays(draw: st.DrawFn) -> pa.Array | pa.ChunkedArray:
    kind = draw(st.sampled_from(["date32", "date64", "timestamp"]))
    if kind == "date32":
        typ, lo, hi, per_day = pa.date32(), I32_MIN, I32_MAX, 1
    elif kind == "date64":
        typ, lo, hi, per_day = pa.date64(), I64_MIN, I64_MAX, DAY_SECONDS * 1_000
    else:
        unit = draw(st.sampled_from(list(PER_SECOND)))
        tz = draw(st.one_of(st.none(), st.sampled_from(sorted(_NAMED_OFFSETS)), fixed_offsets()))
        typ, lo, hi = pa.timestamp(unit, tz), I64_MIN, I64_MAX
        per_day = DAY_SECONDS * PER_SECOND[unit]
    near_epoch = 400 * 366 * per_day  # the years 1570..2370, where real data lives
    value = st.one_of(
        st.none(),
        st.integers(lo, hi),
        st.integers(max(lo, -near_epoch), min(hi, near_epoch)),
        st.sampled_from(_edges(per_day, lo, hi)),
    )
    values = draw(st.lists(value, max_size=50))
    arr = pa.array(values, typ)
    layout = draw(st.sampled_from(["plain", "sliced", "dictionary", "chunked"]))
    if layout == "sliced":
        arr = pa.array([None, 0, *values], typ).slice(2)
    elif layout == "dictionary":
        arr = arr.dictionary_encode()
    elif layout == "chunked":
        cut = draw(st.integers(0, len(values)))
        arr = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], typ)
    return arr


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(arr=date_arrays(), part=st.sampled_from(PARTS))
def test_matches_datafusion(arr: pa.Array | pa.ChunkedArray, part: str) -> None:
    assert supports(arr.type)
    assert_matches_datafusion(arr, part)


@pytest.mark.parametrize("tz", sorted(_NAMED_OFFSETS))
def test_every_named_fixed_zone_matches_datafusion(tz: str) -> None:
    arr = pa.array([0, 1_800, 43_200, DAY_SECONDS - 1, -1, None], pa.timestamp("s", tz))
    for part in PARTS:
        assert_matches_datafusion(arr, part)


# --------------------------------------------------------------------------------------------
# Hand-written cases
# --------------------------------------------------------------------------------------------


def _days(y: int, m: int, d: int) -> int:
    return (datetime.date(y, m, d) - datetime.date(1970, 1, 1)).days


def _ymdh(arr: pa.Array) -> list[tuple]:
    return list(zip(*(assert_matches_datafusion(arr, p).to_pylist() for p in PARTS)))


def test_dates_around_the_epoch_year_zero_and_leap_days() -> None:
    days = [
        0,  # 1970-01-01
        -1,  # 1969-12-31
        -719_528,  # 0000-01-01: year 0 (1 BC) exists in the proleptic Gregorian calendar
        -719_529,  # -0001-12-31
        -719_528 + 59,  # 0000-02-29: year 0 is a leap year
        _days(2000, 2, 29),  # divisible by 400: leap
        _days(1900, 2, 28) + 1,  # divisible by 100 only: 1900-03-01, no Feb 29
        _days(2024, 2, 29),
        _days(1600, 2, 29),
        None,
    ]
    assert _ymdh(pa.array(days, pa.date32())) == [
        (1970, 1, 1, 0),
        (1969, 12, 31, 0),
        (0, 1, 1, 0),
        (-1, 12, 31, 0),
        (0, 2, 29, 0),
        (2000, 2, 29, 0),
        (1900, 3, 1, 0),
        (2024, 2, 29, 0),
        (1600, 2, 29, 0),
        (None, None, None, None),
    ]
    ms = [None if d is None else d * DAY_SECONDS * 1_000 for d in days]
    assert _ymdh(pa.array(ms, pa.date64())) == _ymdh(pa.array(days, pa.date32()))


@pytest.mark.parametrize("unit", list(PER_SECOND))
def test_timestamps_just_before_midnight(unit: str) -> None:
    per_second = PER_SECOND[unit]
    last_2023 = _days(2024, 1, 1) * DAY_SECONDS * per_second - 1
    naive = pa.array([-1, 0, last_2023], pa.timestamp(unit))
    assert _ymdh(naive) == [(1969, 12, 31, 23), (1970, 1, 1, 0), (2023, 12, 31, 23)]
    assert _ymdh(naive.cast(pa.timestamp(unit, "UTC"))) == _ymdh(naive)
    east = pa.array([-1, 0, last_2023], pa.timestamp(unit, "+05:30"))
    assert _ymdh(east) == [(1970, 1, 1, 5), (1970, 1, 1, 5), (2024, 1, 1, 5)]
    west = pa.array([-1, 0, last_2023], pa.timestamp(unit, "-08:00"))
    assert _ymdh(west) == [(1969, 12, 31, 15), (1969, 12, 31, 16), (2023, 12, 31, 15)]


def test_extremes_become_null_outside_chronos_range() -> None:
    assert _ymdh(pa.array([I32_MAX, I32_MIN, _MAX_DAY, _MIN_DAY], pa.date32())) == [
        (None, None, None, 0),  # DataFusion: 'hour' of any non-NULL date32 is 0
        (None, None, None, 0),
        (262142, 12, 31, 0),
        (-262143, 1, 1, 0),
    ]
    for unit in ("s", "ms", "us"):
        assert _ymdh(pa.array([I64_MAX, I64_MIN], pa.timestamp(unit))) == [(None,) * 4] * 2
    assert _ymdh(pa.array([I64_MAX, I64_MIN], pa.date64())) == [(None,) * 4] * 2
    # Nanoseconds always fit: 1677-09-21T00:12:43.145224192 .. 2262-04-11T23:47:16.854775807.
    assert _ymdh(pa.array([I64_MIN, I64_MAX], pa.timestamp("ns"))) == [
        (1677, 9, 21, 0),
        (2262, 4, 11, 23),
    ]
    # The check is on the UTC instant; the local time may then leave chrono's range.
    last_second = (_MAX_DAY + 1) * DAY_SECONDS - 1
    first_second = _MIN_DAY * DAY_SECONDS
    assert _ymdh(pa.array([last_second, last_second + 1], pa.timestamp("s", "+14:00"))) == [
        (262143, 1, 1, 13),
        (None,) * 4,
    ]
    assert _ymdh(pa.array([first_second, first_second - 1], pa.timestamp("s", "-08:00"))) == [
        (-262144, 12, 31, 16),
        (None,) * 4,
    ]


def test_dictionary_with_nulls_in_indices_and_values() -> None:
    dictionary = pa.array([-1, None, I64_MAX, 2**62], pa.timestamp("us", "+05:30"))
    arr = pa.DictionaryArray.from_arrays(pa.array([0, None, 1, 2, 3, 0], pa.int8()), dictionary)
    assert _ymdh(arr) == [
        (1970, 1, 1, 5),
        (None,) * 4,
        (None,) * 4,
        (None,) * 4,
        (148108, 7, 6, 19),
        (1970, 1, 1, 5),
    ]


def test_empty_inputs() -> None:
    for arr in (pa.array([], pa.date32()), pa.chunked_array([], pa.timestamp("ms", "UTC"))):
        out = date_part(arr, "year")
        assert out.type == pa.int32() and len(out) == 0


@pytest.mark.parametrize(
    "arrow_type",
    [
        pa.timestamp("us", "Europe/Amsterdam"),
        pa.timestamp("s", "America/New_York"),
        pa.dictionary(pa.int32(), pa.timestamp("ns", "Asia/Kolkata")),  # fixed now, not always
        pa.timestamp("s", "utc"),  # zone names are case-sensitive; DataFusion rejects it
        pa.timestamp("s", "+24:00"),
        pa.timestamp("s", "+5:30"),
        pa.int64(),
        pa.null(),
        pa.time32("s"),
    ],
)
def test_unsupported_types(arrow_type: pa.DataType) -> None:
    assert not supports(arrow_type)
    with pytest.raises(ValueError):
        date_part(pa.nulls(2, arrow_type), "year")


def test_unsupported_part() -> None:
    with pytest.raises(ValueError):
        date_part(pa.array([0], pa.date32()), "minute")
