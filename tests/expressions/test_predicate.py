"""The predicate tree: decoded from pushed Arrow filters without loss, evaluated as DataFusion
evaluates the same SQL (three-valued logic, NaN and -0.0 included)."""

from __future__ import annotations

import datetime
import math

import datafusion
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal_sql.expressions.predicate import (
    And,
    Compare,
    Const,
    InList,
    IsNull,
    Not,
    Opaque,
    Or,
    negation_normal_form,
)
from memwal_sql.expressions.substrait import decode_filter, lance_filter
from memwal_sql.expressions.visitors import evaluate, to_arrow_filter

SCHEMA = pa.schema(
    [
        ("i", pa.int64()),
        ("j", pa.int32()),
        ("s", pa.string()),
        ("f", pa.float64()),
        ("d", pa.date32()),
        ("b", pa.bool_()),
        ("ts", pa.timestamp("us")),
    ]
)
VALUES = {
    "i": st.integers(-(2**62), 2**62),
    "j": st.integers(-(2**31), 2**31 - 1),
    "s": st.sampled_from(["", "a", "b", "C:\\new", "a\\b", "it's", "é, y", "p1", "\x00"]),
    "f": st.sampled_from([0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, math.nan]),
    "d": st.dates(min_value=datetime.date(1900, 1, 1), max_value=datetime.date(2100, 1, 1)),
    "b": st.booleans(),
    "ts": st.datetimes(
        min_value=datetime.datetime(1900, 1, 1), max_value=datetime.datetime(2100, 1, 1)
    ),
}
OPS = ["=", "!=", "<", "<=", ">", ">="]


@st.composite
def atoms(draw, columns=tuple(VALUES)):
    col = draw(st.sampled_from(list(columns)))
    typ = SCHEMA.field(col).type
    kind = draw(st.sampled_from(["cmp", "in", "null"]))
    if kind == "null":
        return IsNull(col)
    if kind == "in":
        values = draw(st.lists(VALUES[col], max_size=draw(st.sampled_from([4, 40, 5000]))))
        return InList(col, pa.array(values, typ), has_null=draw(st.booleans()))
    return Compare(col, draw(st.sampled_from(OPS)), pa.scalar(draw(VALUES[col]), typ))


trees = st.recursive(
    atoms(),
    lambda kids: st.one_of(
        st.lists(kids, min_size=2, max_size=3).map(lambda c: And(tuple(c))),
        st.lists(kids, min_size=2, max_size=3).map(lambda c: Or(tuple(c))),
        kids.map(Not),
        st.sampled_from([Const(True), Const(False), Const(None)]),
    ),
    max_leaves=6,
)

rows = st.lists(
    st.fixed_dictionaries({c: st.none() | v for c, v in VALUES.items()}), min_size=1, max_size=8
)


def naive_arrow(p):
    """The tree as DataFusion pushes SQL to a dataset (pyarrow's own operators)."""
    if isinstance(p, Const):
        return pc.scalar(p.value) if p.value is not None else pc.scalar(pa.scalar(None, pa.bool_()))
    if isinstance(p, (And, Or)):
        out = naive_arrow(p.children[0])
        for c in p.children[1:]:
            out = (out & naive_arrow(c)) if isinstance(p, And) else (out | naive_arrow(c))
        return out
    if isinstance(p, Not):
        return ~naive_arrow(p.child)
    if isinstance(p, IsNull):
        return pc.field(p.column).is_null()
    if isinstance(p, InList):
        values = (
            p.values if not p.has_null else pa.concat_arrays([p.values, pa.nulls(1, p.values.type)])
        )
        return pc.field(p.column).isin(values)
    ops = {
        "=": "__eq__",
        "!=": "__ne__",
        "<": "__lt__",
        "<=": "__le__",
        ">": "__gt__",
        ">=": "__ge__",
    }
    return getattr(pc.field(p.column), ops[p.op])(pc.scalar(p.value))


def sql(p):
    """The tree as SQL text, for DataFusion as the oracle."""
    if isinstance(p, Const):
        return {True: "TRUE", False: "FALSE", None: "CAST(NULL AS BOOLEAN)"}[p.value]
    if isinstance(p, (And, Or)):
        return "(" + (" AND " if isinstance(p, And) else " OR ").join(map(sql, p.children)) + ")"
    if isinstance(p, Not):
        return f"(NOT {sql(p.child)})"
    if isinstance(p, IsNull):
        return f"({p.column} IS NULL)"
    typ = SCHEMA.field(p.column).type
    if isinstance(p, InList):
        items = [literal(v, typ) for v in p.values] + (["NULL"] if p.has_null else [])
        if not items:
            return "FALSE"
        if pa.types.is_floating(typ):  # DataFusion rewrites lists under 4 items as `=`s
            items += ["CAST(1e300 AS DOUBLE)"] * max(0, 4 - len(items))
        return f"({p.column} IN ({', '.join(items)}))"
    return f"({p.column} {'<>' if p.op == '!=' else p.op} {literal(p.value, typ)})"


def literal(scalar, typ):
    v = scalar.as_py()
    if pa.types.is_string(typ):
        return "'" + v.replace("'", "''") + "'"
    if pa.types.is_floating(typ):
        return f"CAST('{v}' AS DOUBLE)"
    if pa.types.is_date(typ):
        return f"DATE '{v.isoformat()}'"
    if pa.types.is_timestamp(typ):
        return f"CAST('{v.isoformat()}' AS TIMESTAMP(6))"
    if pa.types.is_boolean(typ):
        return "TRUE" if v else "FALSE"
    return f"CAST({v} AS {'INT' if typ == pa.int32() else 'BIGINT'})"


def datafusion_eval(p, table):
    ctx = datafusion.SessionContext()
    ctx.register_record_batches("t", [table.to_batches()])
    ctx.sql("SET datafusion.execution.target_partitions = 1").collect()
    # DataFusion's simplifier folds `p AND NOT p` to FALSE even where p is NULL (upstream);
    # the oracle is SQL's own three-valued logic, so it evaluates the expression as written.
    ctx.remove_optimizer_rule("simplify_expressions")
    return ctx.sql(f"SELECT {sql(p)} AS m FROM t").to_arrow_table().column("m").to_pylist()


@settings(max_examples=150, deadline=None)
@given(tree=trees, data=rows)
def test_evaluation_equals_datafusion_on_the_same_sql(tree, data):
    table = pa.Table.from_pylist(data, schema=SCHEMA)
    assert evaluate(tree, table).to_pylist() == datafusion_eval(tree, table), sql(tree)


@settings(max_examples=150, deadline=None)
@given(tree=trees, data=rows)
def test_decoding_keeps_every_value(tree, data):
    """What DataFusion pushes (pyarrow operators, IN lists of any length) decodes to a tree
    that means the SQL: the same rows pass as in DataFusion."""
    table = pa.Table.from_pylist(data, schema=SCHEMA)
    decoded = decode_filter(naive_arrow(tree), SCHEMA)
    assert not _has_opaque(decoded)
    assert evaluate(decoded, table).to_pylist() == evaluate(tree, table).to_pylist()


@settings(max_examples=100, deadline=None)
@given(tree=trees, data=rows)
def test_the_lance_filter_passes_exactly_the_true_rows(tree, data):
    table = pa.Table.from_pylist(data, schema=SCHEMA)
    expr, exact = lance_filter(tree, SCHEMA)
    assert exact == ("InList(column='f'" not in repr(tree))  # float IN lists: read, then checked
    if not exact:
        return
    want = [m is True for m in evaluate(tree, table).to_pylist()]
    got = pds.dataset(table).to_table(columns={"m": expr}).column("m").to_pylist()
    # pyarrow stands in for Lance here except on NaN (in the rows or the filter's literals),
    # which pyarrow orders differently.
    rows_nan = any(isinstance(v, float) and math.isnan(v) for v in table.column("f").to_pylist())
    if not rows_nan and "nan" not in repr(tree):
        assert [m is True for m in got] == want


def _has_opaque(p):
    if isinstance(p, (And, Or)):
        return any(_has_opaque(c) for c in p.children)
    if isinstance(p, Not):
        return _has_opaque(p.child)
    return isinstance(p, Opaque)


def test_in_lists_keep_special_strings_and_every_value():
    values = ["C:\\new", "a\\b", 'q"uote', "it's", "\n"] + [f"k{i}" for i in range(5000)]
    tree = decode_filter(pc.field("s").isin(values), SCHEMA)
    assert isinstance(tree, InList) and tree.values.to_pylist() == values


def test_constant_folded_filters_are_constants():
    assert decode_filter(pa.scalar(False), SCHEMA) == Const(False)
    assert decode_filter(pa.scalar(None, pa.bool_()), SCHEMA) == Const(None)
    assert decode_filter(None, SCHEMA) is None


def test_not_in_is_null_for_null_values_unlike_pyarrow():
    table = pa.table({"s": ["a", None, "c"]})
    tree = decode_filter(~pc.field("s").isin(["a", "b"]), table.schema)
    assert evaluate(tree, table).to_pylist() == [False, None, True]
    assert table.filter(~pc.field("s").isin(["a", "b"])).num_rows == 2  # pyarrow's answer


def test_what_the_tree_does_not_model_stays_opaque_and_is_evaluated_by_arrow():
    tree = decode_filter((pc.abs(pc.field("i")) == 3) & (pc.field("j") > 1), SCHEMA)
    assert isinstance(tree, And) and isinstance(tree.children[0], Opaque)
    assert tree.children[0].columns == ("i",)
    table = pa.Table.from_pylist(
        [{"i": -3, "j": 2}, {"i": 3, "j": 0}, {"i": 4, "j": 5}], schema=SCHEMA
    )
    assert evaluate(tree, table).to_pylist() == [True, False, False]
    assert lance_filter(tree, SCHEMA) == (None, False)  # evaluated after reading, not in Lance
    # A timestamp[ns] literal has no Substrait form: decoded, but evaluated after reading.
    ns = pa.schema([("t", pa.timestamp("ns"))])
    tree = decode_filter(pc.field("t") > pa.scalar(5, pa.timestamp("ns")), ns)
    assert tree == Compare("t", ">", pa.scalar(5, pa.timestamp("ns")))
    assert lance_filter(tree, ns) == (None, False)


def test_negation_normal_form_keeps_meaning():
    t = Not(And((Compare("i", "<", pa.scalar(3)), Not(IsNull("s")))))
    assert negation_normal_form(t) == Or((Compare("i", ">=", pa.scalar(3)), IsNull("s")))
    assert "invert(is_in" in str(to_arrow_filter(Not(InList("s", pa.array(["a"])))))


def test_a_deep_filter_is_decoded_flat_in_linear_time():
    # DataFusion pushes `a OR b OR ...` nested one level per OR; pyarrow's Substrait of it
    # doubles with each level (see memwal_sql.compat.arrow), so it is decoded from Arrow's own
    # serialization, into one OR of every term. Its first term compares with a timestamp[ns]
    # literal, which Substrait cannot hold either: decoded exactly all the same.
    def chain(n):
        expr = pc.field("ts") < pa.scalar(5_000, pa.timestamp("ns"))
        for k in range(1, n):
            expr = expr | (pc.field("i") == k) & ~pc.field("s").isin([str(k), "x"])
            expr = expr | (pc.field("j") == -k)
        return expr

    short = decode_filter(chain(3), SCHEMA)
    assert isinstance(short, Or) and len(short.children) == 5 and not _has_opaque(short)
    assert short.children[0] == Compare("ts", "<", pa.scalar(5, pa.timestamp("us")))
    tree = decode_filter(chain(2000), SCHEMA)
    assert isinstance(tree, Or) and len(tree.children) == 1 + 2 * 1999 and not _has_opaque(tree)
    rows = [
        {"i": i, "j": -(i // 2) if i % 5 == 0 else i, "s": str(i) if i % 3 else "y", "ts": ts}
        for i in range(0, 4000, 7)
        for ts in (datetime.datetime(2000, 1, 1), None)
    ]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    want = [
        True
        if (1 <= r["i"] < 2000 and r["s"] not in (str(r["i"]), "x")) or 1 <= -r["j"] < 2000
        else None
        if r["ts"] is None
        else False
        for r in rows
    ]
    assert evaluate(tree, table).to_pylist() == want
    assert lance_filter(tree, SCHEMA) == (None, False)  # too big for Lance: applied after
