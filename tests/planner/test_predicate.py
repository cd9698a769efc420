"""The filter parser against pyarrow itself: what it parses must mean what pyarrow means."""

from __future__ import annotations

import datetime
import operator

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.predicate import And, Cmp, In, Not, Or, Unknown, parse_filter

SCHEMA = pa.schema([("i", pa.int64()), ("j", pa.int32()), ("s", pa.string()),
                    ("f", pa.float64()), ("d", pa.date32()), ("b", pa.bool_()),
                    ("ts", pa.timestamp("us"))])
OPS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
       ">": operator.gt, ">=": operator.ge}

values = {
    "i": st.integers(-(2**62), 2**62),
    "j": st.integers(-(2**31), 2**31 - 1),
    "s": st.text(max_size=6),
    "f": st.floats(allow_nan=False, allow_infinity=False, width=32),
    "d": st.dates(min_value=datetime.date(1970, 1, 1), max_value=datetime.date(2100, 1, 1)),
    "b": st.booleans(),
    "ts": st.datetimes(min_value=datetime.datetime(1970, 1, 1),
                       max_value=datetime.datetime(2100, 1, 1)),
}


@st.composite
def leaf(draw):
    col = draw(st.sampled_from(list(values)))
    typ = SCHEMA.field(col).type
    if draw(st.booleans()):
        v = draw(values[col])
        op = draw(st.sampled_from(list(OPS)))
        return getattr(operator, {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt",
                                  ">=": "ge"}[op])(pc.field(col), pa.scalar(v, typ))
    vs = draw(st.lists(values[col], min_size=1, max_size=4))
    return pc.field(col).isin(pa.array(vs, typ))


exprs = st.recursive(leaf(), lambda kids: st.one_of(
    st.tuples(kids, kids).map(lambda t: t[0] & t[1]),
    st.tuples(kids, kids).map(lambda t: t[0] | t[1]),
    kids.map(lambda e: ~e),
), max_leaves=5)


def evaluate(node, row):
    """Evaluate a parsed tree on one row (None = unknown)."""
    if isinstance(node, Unknown):
        return None
    if isinstance(node, And):
        a, b = evaluate(node.left, row), evaluate(node.right, row)
        return None if None in (a, b) else a and b
    if isinstance(node, Or):
        a, b = evaluate(node.left, row), evaluate(node.right, row)
        return None if None in (a, b) else a or b
    if isinstance(node, Not):
        a = evaluate(node.child, row)
        return None if a is None else not a
    if isinstance(node, Cmp):
        return OPS[node.op](row[node.column], node.value)
    assert isinstance(node, In)
    return row[node.column] in node.values


@settings(max_examples=200, deadline=None)
@given(expr=exprs, rows=st.lists(st.fixed_dictionaries(values), min_size=1, max_size=5))
def test_parsed_tree_means_what_pyarrow_means(expr, rows):
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    node = parse_filter(expr, SCHEMA)
    want = table.filter(expr).to_pylist()
    got = []
    for row in table.to_pylist():
        r = evaluate(node, row)
        if r is None:
            return  # the parser gave up on part of it: nothing to compare
        if r:
            got.append(row)
    assert got == want


def test_known_shapes():
    f = pc.field
    assert parse_filter(f("i") == 3, SCHEMA) == Cmp("i", "==", 3)
    assert parse_filter(f("s") == 'a"b) or (x', SCHEMA) == Cmp("s", "==", 'a"b) or (x')
    assert parse_filter(f("s").isin(["x", "é, y"]), SCHEMA) == In("s", ("x", "é, y"))
    assert isinstance(parse_filter(f("i").isin(list(range(40))), SCHEMA), Unknown)  # elided set
    assert isinstance(parse_filter(pc.abs(f("i")) == 3, SCHEMA), Unknown)
    assert parse_filter(None, SCHEMA) is None
