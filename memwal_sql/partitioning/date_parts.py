"""DataFusion 55's ``date_part('year'|'month'|'day'|'hour', col)``, in numpy, without DataFusion.

Why: region pruning and lookup routing evaluate the region spec's date-part transforms
inside DataFusion callbacks, where calling back into DataFusion is not allowed. The writer
(which may use DataFusion) and the reader (which uses this module) must agree bit for bit,
so this mirrors DataFusion 55 (arrow-rs + chrono) exactly, including its edge cases:

* The result is int32; NULL in gives NULL out. Dictionary columns act like their values.
* Dates use the proleptic Gregorian calendar (year 0 exists, 1 BC), computed with Howard
  Hinnant's civil-from-days algorithm and floor division, so negative values work.
* chrono only represents -262143-01-01 .. 262142-12-31 (UTC). A value outside that range
  gives NULL, e.g. date32 2**31-1, or timestamp[s] 2**63-1. timestamp[ns] always fits.
* The range check is on the UTC instant. The local time of a tz-aware column is then
  UTC + offset without a second check, so it may land in year 262143 or -262144.
* ``date_part('hour', date32)`` is 0 for every non-NULL row, even out-of-range ones
  (DataFusion never converts a date32 for time parts). date64 behaves like timestamp[ms].
* Time zones follow arrow-rs: '+HH:MM', '+HHMM' and '+HH' (either sign; the total must be
  under 24 h, so '+05:75' is 6:15 and '+24:00' is invalid), and the tz database's fixed
  zones ('UTC', 'Etc/UTC', 'GMT', 'Etc/GMT+5', ...; names are case-sensitive).
  Zones with DST (e.g. 'Europe/Amsterdam') are not handled: ``supports`` is False for them.
* The null type is not supported (DataFusion raises an error for it).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

PARTS = ("year", "month", "day", "hour")

# Days since 1970-01-01 of chrono's first and last date: -262143-01-01 and 262142-12-31.
_MIN_DAY, _MAX_DAY = -96_465_292, 95_026_236

_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}

# Fixed-offset zones of the tz database (chrono-tz), in seconds east of UTC. Etc/GMT+N is
# *west* of Greenwich (POSIX sign convention).
_NAMED_OFFSETS = {
    **dict.fromkeys(
        (
            "UTC",
            "Etc/UTC",
            "UCT",
            "Etc/UCT",
            "Universal",
            "Etc/Universal",
            "Zulu",
            "Etc/Zulu",
            "GMT",
            "Etc/GMT",
            "GMT0",
            "Etc/GMT0",
            "GMT+0",
            "Etc/GMT+0",
            "GMT-0",
            "Etc/GMT-0",
            "Greenwich",
            "Etc/Greenwich",
        ),
        0,
    ),
    **{f"Etc/GMT+{n}": -3600 * n for n in range(1, 13)},
    **{f"Etc/GMT-{n}": 3600 * n for n in range(1, 15)},
}


def _utc_offset(tz: str | None) -> int | None:
    """Seconds east of UTC for a tz-naive or fixed-offset zone, None for any other zone."""
    if tz is None:
        return 0
    if tz in _NAMED_OFFSETS:
        return _NAMED_OFFSETS[tz]
    # arrow-rs `parse_fixed_offset`: [+-]HH:MM, [+-]HHMM or [+-]HH.
    if len(tz) == 6 and tz[3] == ":":
        digits = tz[1:3] + tz[4:6]
    elif len(tz) in (3, 5):
        digits = (tz[1:] + "00")[:4]
    else:
        return None
    if tz[0] not in "+-" or any(c not in "0123456789" for c in digits):
        return None
    secs = int(digits[:2]) * 3600 + int(digits[2:]) * 60
    if secs >= 86_400:
        return None
    return secs if tz[0] == "+" else -secs


def supports(arrow_type: pa.DataType) -> bool:
    """Whether :func:`date_part` can evaluate columns of this type (else use DataFusion).

    >>> supports(pa.date32()), supports(pa.timestamp("us", "+05:30"))
    (True, True)
    >>> supports(pa.timestamp("us", "Europe/Amsterdam")), supports(pa.int64())
    (False, False)
    """
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if pa.types.is_date32(arrow_type) or pa.types.is_date64(arrow_type):
        return True
    return pa.types.is_timestamp(arrow_type) and _utc_offset(arrow_type.tz) is not None


def date_part(arr: pa.Array | pa.ChunkedArray, part: str) -> pa.Array:
    """``date_part(part, arr)`` as DataFusion 55 computes it, as an int32 array.

    >>> days = pa.array([-1, 0, None, 2**31 - 1], pa.date32())  # 2**31-1: beyond chrono
    >>> date_part(days, "year").to_pylist()
    [1969, 1970, None, None]
    >>> ts = pa.array([-1, 0], pa.timestamp("s", "-08:00"))
    >>> date_part(ts, "hour").to_pylist()
    [15, 16]
    """
    if part not in PARTS:
        raise ValueError(f"date_part {part!r} is not one of {PARTS}")
    if isinstance(arr, pa.ChunkedArray):
        if not supports(arr.type):
            raise ValueError(f"date_part cannot evaluate {arr.type} without DataFusion")
        chunks = [date_part(c, part) for c in arr.chunks]
        return pa.concat_arrays(chunks) if chunks else pa.array([], pa.int32())
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    t = arr.type
    if not supports(t):
        raise ValueError(f"date_part cannot evaluate {t} without DataFusion")

    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_date32(t):
        days = _ints(arr, pa.int32())
        if part == "hour":
            return _result(np.zeros(len(arr), np.int64), valid)
        secs_of_day, offset = np.zeros(len(arr), np.int64), 0
    else:
        unit_per_second = 1_000 if pa.types.is_date64(t) else _PER_SECOND[t.unit]
        utc_offset = 0 if pa.types.is_date64(t) else _utc_offset(t.tz)
        assert utc_offset is not None  # supports(t) held: a tz-naive or fixed-offset timestamp
        offset = utc_offset
        values = _ints(arr, pa.int64())
        days, rem = np.divmod(values, 86_400 * unit_per_second)  # floor: rem >= 0
        secs_of_day = rem // unit_per_second
    valid &= (days >= _MIN_DAY) & (days <= _MAX_DAY)  # the UTC instant must fit chrono

    # Local time; the offset may move the day by one either way.
    day_shift, local_secs = np.divmod(secs_of_day + offset, 86_400)
    if part == "hour":
        return _result(local_secs // 3600, valid)
    year, month, day = _civil_from_days(days + day_shift)
    return _result({"year": year, "month": month, "day": day}[part], valid)


def _ints(arr: pa.Array, int_type: pa.DataType) -> np.ndarray:
    """The physical values as int64 numpy; NULL slots read as 0."""
    return arr.view(int_type).fill_null(0).to_numpy().astype(np.int64)


def _result(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    return pa.array(values.astype(np.int32), pa.int32(), mask=None if valid.all() else ~valid)


def _civil_from_days(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(year, month, day) of days since 1970-01-01, proleptic Gregorian (Hinnant's algorithm)."""
    z = z + 719_468  # days since 0000-03-01
    era = z // 146_097  # 400-year eras; floor division, so negative days work
    doe = z - era * 146_097  # [0, 146096]
    yoe = (doe - doe // 1_460 + doe // 36_524 - doe // 146_096) // 365  # [0, 399]
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)  # [0, 365], from March 1st
    mp = (5 * doy + 2) // 153  # [0, 11], March = 0
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    return year, month, day
