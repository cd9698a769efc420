"""Arrow types of region values: their ``result_type`` names, and which types each transform takes.

``RegionField.result_type`` stores an Arrow type as a name, spelled the way Lance 14 spells it
(:func:`arrow_type_name`, :func:`parse_arrow_type`). The "type families" are the per-transform
predicates that :class:`~memwal_sql.partitioning.region_spec.RegionSpec` uses to check source columns.
"""

from __future__ import annotations

import pyarrow as pa

from memwal_sql.errors import InvalidRegionSpecError

__all__ = ["arrow_type_name", "parse_arrow_type"]

# --------------------------------------------------------------------------------------------
# Arrow type names (RegionField.result_type)
# --------------------------------------------------------------------------------------------

# Names that Lance 14 was observed to write for identity sharding. They are Arrow-rs style
# snake case. Lance accepts no other identity source types, so for the others we extend the
# same style in the way Lance's LogicalType names parametrised types ("time32:s",
# "timestamp:us:UTC").
_SIMPLE_TYPE_NAMES: dict[pa.DataType, str] = {
    pa.int8(): "int8",
    pa.int16(): "int16",
    pa.int32(): "int32",
    pa.int64(): "int64",
    pa.uint8(): "uint8",
    pa.uint16(): "uint16",
    pa.uint32(): "uint32",
    pa.uint64(): "uint64",
    pa.bool_(): "boolean",
    pa.utf8(): "utf8",
    pa.large_utf8(): "large_utf8",
    pa.binary(): "binary",
    pa.large_binary(): "large_binary",
    pa.float16(): "float16",
    pa.float32(): "float32",
    pa.float64(): "float64",
    pa.date32(): "date32",
    pa.date64(): "date64",
    pa.null(): "null",
}
_TYPES_BY_NAME: dict[str, pa.DataType] = {v: k for k, v in _SIMPLE_TYPE_NAMES.items()}
# Accepted on input only: pyarrow's own spellings.
_TYPES_BY_NAME.update(
    {
        "bool": pa.bool_(),
        "string": pa.utf8(),
        "large_string": pa.large_utf8(),
        "halffloat": pa.float16(),
        "float": pa.float32(),
        "double": pa.float64(),
    }
)


def arrow_type_name(arrow_type: pa.DataType) -> str:
    """Return the ``result_type`` name for an Arrow type, spelled the way Lance 14 spells it.

    Example:
        >>> arrow_type_name(pa.large_utf8()), arrow_type_name(pa.timestamp("us", "UTC"))
        ('large_utf8', 'timestamp:us:UTC')
    """
    name = _SIMPLE_TYPE_NAMES.get(arrow_type)
    if name is not None:
        return name
    if pa.types.is_timestamp(arrow_type):
        return f"timestamp:{arrow_type.unit}" + (f":{arrow_type.tz}" if arrow_type.tz else "")
    if pa.types.is_time32(arrow_type) or pa.types.is_time64(arrow_type):
        return f"time{arrow_type.bit_width}:{arrow_type.unit}"
    raise InvalidRegionSpecError(f"Arrow type {arrow_type} cannot be a region value type")


def parse_arrow_type(name: str) -> pa.DataType:
    """Parse a ``result_type`` name (see :func:`arrow_type_name`) back into an Arrow type.

    Example:
        >>> parse_arrow_type("utf8"), parse_arrow_type("time64:ns")
        (DataType(string), Time64Type(time64[ns]))
    """
    simple = _TYPES_BY_NAME.get(name)
    if simple is not None:
        return simple
    parts = name.split(":")
    try:
        if parts[0] == "timestamp" and len(parts) >= 2:
            # A tz like "+05:30" contains ':'; re-join everything after the unit.
            return pa.timestamp(parts[1], ":".join(parts[2:]) or None)
        if parts[0] == "time32" and len(parts) == 2:
            return pa.time32(parts[1])
        if parts[0] == "time64" and len(parts) == 2:
            return pa.time64(parts[1])
    except (ValueError, TypeError, pa.ArrowInvalid) as exc:
        raise InvalidRegionSpecError(f"invalid region result_type {name!r}: {exc}") from exc
    raise InvalidRegionSpecError(f"unknown region result_type {name!r}")


# --------------------------------------------------------------------------------------------
# Type families
# --------------------------------------------------------------------------------------------


def _is_int(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_temporal_hashable(t: pa.DataType) -> bool:
    return (
        pa.types.is_date32(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_time32(t)
        or pa.types.is_time64(t)
    )


def _bucket_type_ok(t: pa.DataType) -> bool:
    # Exactly Lance 14's `hash_array_value` match arms. Date64, binary, decimal, float16 and
    # nested types fall into its "Unsupported bucket sharding column type" arm.
    return (
        _is_int(t)
        or pa.types.is_boolean(t)
        or pa.types.is_float32(t)
        or pa.types.is_float64(t)
        or _is_string(t)
        or _is_temporal_hashable(t)
    )


def _multi_bucket_type_ok(t: pa.DataType) -> bool:
    # multi_bucket normalises date64 to days, so it can also accept date64.
    return _bucket_type_ok(t) or pa.types.is_date64(t)


def _identity_type_ok(t: pa.DataType) -> bool:
    # Lance's initialize_mem_wal accepts ints, bool, utf8 and large_utf8 for identity. Its
    # evaluator passes any column through, and the seed spec allows any type. We also accept
    # temporal and binary types, which have an obvious region-value encoding. Floats are
    # refused: -0.0/+0.0 and the many NaN payloads would split one logical value over
    # several regions.
    return (
        _is_int(t)
        or pa.types.is_boolean(t)
        or _is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_date(t)
        or pa.types.is_time(t)
        or pa.types.is_timestamp(t)
    )


def _date_part_type_ok(t: pa.DataType) -> bool:
    return pa.types.is_date(t) or pa.types.is_timestamp(t)


def _truncate_type_ok(t: pa.DataType) -> bool:
    return _is_int(t) or _is_string(t)


# The source types the bucket transforms accept, in words. Both the spec check (``_TYPE_CHECKS``
# in region_spec) and the hashers' own errors (murmur3) quote them.
_BUCKET_TYPES = (
    "int8..int64, uint8..uint64, bool, float32/64, utf8, large_utf8, date32, time32/64 or timestamp"
)
_MULTI_BUCKET_TYPES = "the bucket types or date64"
