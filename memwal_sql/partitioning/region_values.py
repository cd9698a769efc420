"""Region values as bytes: the ``RegionFieldEntry.value`` encoding Lance 14 uses."""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from memwal_sql.errors import CorruptManifestError, InvalidInputError, InvalidRegionSpecError
from memwal_sql.partitioning.arrow_types import _is_string, parse_arrow_type

#: A region value as Python sees it: what a region field's Arrow type converts to.
RegionValue = (
    int
    | float
    | bool
    | str
    | bytes
    | datetime.date
    | datetime.datetime
    | datetime.time
    | datetime.timedelta
)

__all__ = ["RegionValue", "decode_region_value", "encode_region_value"]

# --------------------------------------------------------------------------------------------
# Region field value encoding (RegionFieldEntry.value)
# --------------------------------------------------------------------------------------------


def encode_region_value(value: Any, arrow_type: pa.DataType | str) -> bytes:
    """Encode one region value as raw little-endian Arrow scalar bytes (``RegionFieldEntry.value``).

    This is Lance's encoding: int32 -> 4 LE bytes, utf8 -> the raw UTF-8 bytes, and every
    fixed-width type -> its Arrow buffer bytes (date32 = days as i32, timestamp = i64 in its
    unit, ...). A bool is one byte 0/1, which is also what a one-row Arrow bitmap holds.
    NULL has no byte encoding: a NULL region value is recorded by *omitting* its
    ``RegionFieldEntry``, because ``b""`` is already the encoding of the empty string.
    Passing ``None`` raises.

    Example:
        >>> encode_region_value(5, "int32"), encode_region_value("ab", pa.utf8())
        (b'\\x05\\x00\\x00\\x00', b'ab')
    """
    t = parse_arrow_type(arrow_type) if isinstance(arrow_type, str) else arrow_type
    if isinstance(value, pa.Scalar):
        value = value.as_py()
    if value is None:
        raise InvalidInputError(
            "a NULL region value has no byte encoding; omit its RegionFieldEntry instead"
        )
    if _is_string(t):
        if not isinstance(value, str):
            raise InvalidInputError(f"expected str for {t}, got {type(value).__name__}")
        return value.encode("utf-8")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return bytes(value)
    if pa.types.is_boolean(t):
        if not isinstance(value, (bool, np.bool_)):
            raise InvalidInputError(f"expected bool for {t}, got {type(value).__name__}")
        return b"\x01" if value else b"\x00"
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t)):
        raise InvalidRegionSpecError(f"region values of type {t} cannot be encoded")
    try:
        arr = pa.array([value], type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise InvalidInputError(f"{value!r} is not a valid {t} region value: {exc}") from exc
    width = t.bit_width // 8
    return arr.buffers()[1].to_pybytes()[:width]


def decode_region_value(data: bytes, arrow_type: pa.DataType | str) -> RegionValue:
    """Decode ``RegionFieldEntry.value`` bytes back into a Python value (inverse of encode).

    Example:
        >>> decode_region_value(b"\\x05\\x00\\x00\\x00", "int32"), decode_region_value(b"ab", "utf8")
        (5, 'ab')
    """
    t = parse_arrow_type(arrow_type) if isinstance(arrow_type, str) else arrow_type
    data = bytes(data)
    if _is_string(t):
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptManifestError(f"region value is not valid UTF-8: {data!r}") from exc
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return data
    if pa.types.is_boolean(t):
        if data not in (b"\x00", b"\x01"):
            raise CorruptManifestError(f"a boolean region value must be 1 byte 0/1, got {data!r}")
        return data == b"\x01"
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t)):
        raise InvalidRegionSpecError(f"region values of type {t} cannot be decoded")
    width = t.bit_width // 8
    if len(data) != width:
        raise CorruptManifestError(f"a {t} region value needs {width} bytes, got {len(data)}")
    return pa.Array.from_buffers(t, 1, [None, pa.py_buffer(data)])[0].as_py()
