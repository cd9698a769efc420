"""What pyarrow 26 does with a filter expression, where memwal-sql reads or writes one.

Substrait (``Expression.to_substrait``), what Lance takes a filter as:

* pyarrow needs the PyPI ``substrait`` package importable (``substrait.proto``) or it says
  it was "not built with support for Substrait".
* Some types have no Substrait form at all: fixed-size lists (vectors) and durations in a
  schema, and timestamp[ns] literals.
* Its size grows with the square of the calls in a filter at best, and doubles with each level
  of nesting: pyarrow writes an extension-URI entry per use of a function and repeats the
  entries of every argument (a chain of 16 ``OR`` s is 50 MB and takes a second; of 30, never
  ends). So a filter is never decoded from Substrait, and a big one is not handed to Lance.

Arrow's own serialization (what pickling an expression writes, :func:`expression_parts`) is
linear: its nodes in prefix order as the key-value metadata of a one-row record batch whose
columns hold the literals and the function options. pyarrow reads that metadata as a dict,
which drops repeated keys, so it is read through the Arrow C data interface.
"""

from __future__ import annotations

import ctypes

import pyarrow as pa
import pyarrow.compute as pc

_NO_SUBSTRAIT_TYPE = (pa.types.is_fixed_size_list, pa.types.is_duration)


def substrait_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types pyarrow cannot put in Substrait replaced by ``null``: a
    filter never compares them with a literal, and one that does is left undecoded.

    Example:
        >>> substrait_schema(pa.schema([("v", pa.list_(pa.float32(), 2))])).field("v").type
        DataType(null)
    """
    return pa.schema(
        [
            f.with_type(pa.null()) if any(p(f.type) for p in _NO_SUBSTRAIT_TYPE) else f
            for f in schema
        ]
    )


def expression_parts(expr: pc.Expression) -> tuple[list[tuple[str, str]], pa.RecordBatch]:
    """Arrow's serialization of ``expr``: its nodes in prefix order as ``(kind, value)`` pairs
    and the one-row batch holding its literals and options. A call is ``("call", function)``,
    its arguments, ``("options", column)`` if it has options, ``("end", function)``; a column
    is ``("field_ref", name)``; a literal ``("literal", column)``. Raises
    ``pa.ArrowNotImplementedError`` for what Arrow cannot serialize (a nested field reference).

    Example:
        >>> expression_parts(pc.field("a") > 1)[0]
        [('call', 'greater'), ('field_ref', 'a'), ('literal', '0'), ('end', 'greater')]
    """
    reader = pa.ipc.open_file(expr.__reduce__()[1][0])
    return _metadata_pairs(reader.schema), reader.get_batch(0)


def expression_of_parts(parts: list[tuple[str, str]], columns: list[pa.Array]) -> pc.Expression:
    """The expression that :func:`expression_parts` gave ``parts`` of (the literal and option
    numbers in ``parts`` index ``columns``, each of one row).

    Example:
        >>> expression_of_parts([("field_ref", "a")], [])
        <pyarrow.compute.Expression a>
    """
    metadata = pa.KeyValueMetadata([(k.encode(), v.encode()) for k, v in parts])
    columns = [*columns, pa.array([0], pa.int8())]  # Arrow wants one row, even without columns
    names = [f"c{i}" for i in range(len(columns))]
    batch = pa.RecordBatch.from_arrays(columns, names=names).replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return pc.Expression._deserialize(sink.getvalue())


class _ArrowSchema(ctypes.Structure):
    """The C data interface's ``struct ArrowSchema``."""

    _fields_ = [
        ("format", ctypes.c_char_p),
        ("name", ctypes.c_char_p),
        ("metadata", ctypes.c_void_p),
        ("flags", ctypes.c_int64),
        ("n_children", ctypes.c_int64),
        ("children", ctypes.c_void_p),
        ("dictionary", ctypes.c_void_p),
        ("release", ctypes.c_void_p),
        ("private_data", ctypes.c_void_p),
    ]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _metadata_pairs(schema: pa.Schema) -> list[tuple[str, str]]:
    """Every key-value pair of ``schema``'s metadata, in order, repeats included."""
    capsule = schema.__arrow_c_schema__()  # released when the capsule is
    exported = _ArrowSchema.from_address(_capsule_pointer(capsule, b"arrow_schema"))
    at = exported.metadata
    if not at:
        return []

    def number() -> int:
        nonlocal at
        value = ctypes.c_int32.from_address(at).value
        at += 4
        return value

    def text() -> str:
        nonlocal at
        size = number()
        value = ctypes.string_at(at, size).decode()
        at += size
        return value

    return [(text(), text()) for _ in range(number())]
