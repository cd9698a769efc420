"""Region pruning: never drops a region that holds a matching row, and does prune."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.expressions.predicate import And, Compare, InList, IsNull, Not, Opaque, Or
from memwal_sql.expressions.visitors import evaluate
from memwal_sql.partitioning.region_spec import RegionSpec
from planner.pruning import prune_regions

SCHEMA = pa.schema(
    [("i", pa.int64()), ("s", pa.string()), ("d", pa.date32()), ("t", pa.timestamp("us", "+05:30"))]
)
SPECS = {
    "bucket_i": RegionSpec.bucket("i", 5),
    "bucket_s": RegionSpec.bucket("s", 3),
    "identity_s": RegionSpec.identity("s"),
    "identity_i": RegionSpec.identity("i"),
    "year_d": RegionSpec.year("d"),
    "month_d": RegionSpec.month("d"),
    "day_d": RegionSpec.day("d"),
    "hour_t": RegionSpec.hour("t"),
    "year_t": RegionSpec.year("t"),
    "truncate_i": RegionSpec.truncate("i", 10),
    "truncate_s": RegionSpec.truncate("s", 1),
    "multi_bucket_i": RegionSpec.multi_bucket(["i"], 4),
    "multi_bucket_is": RegionSpec.multi_bucket(["i", "s"], 4),
    "unsharded": RegionSpec.unsharded(),
    "expression": RegionSpec.expression("col0 % 3", ["i"], "int64"),
}
ints = st.integers(-50, 50)
strs = st.text(alphabet="ab\\", max_size=3)
dates = st.dates(min_value=datetime.date(1999, 11, 1), max_value=datetime.date(2001, 2, 1))
times = st.datetimes(
    min_value=datetime.datetime(1999, 12, 31),
    max_value=datetime.datetime(2000, 1, 2),
    timezones=st.just(datetime.timezone.utc),
)
col_values = {"i": ints, "s": strs, "d": dates, "t": times}


@st.composite
def atom(draw):
    col = draw(st.sampled_from(sorted(col_values)))
    typ = SCHEMA.field(col).type
    kind = draw(st.sampled_from(["cmp", "in", "null"]))
    if kind == "null":
        return IsNull(col)
    if kind == "in":
        values = draw(st.lists(col_values[col], max_size=4))
        return InList(col, pa.array(values, typ), has_null=draw(st.booleans()))
    op = draw(st.sampled_from(["=", "!=", "<", "<=", ">", ">="]))
    return Compare(col, op, pa.scalar(draw(col_values[col]), typ))


predicates = st.recursive(
    atom(),
    lambda kids: st.one_of(
        st.lists(kids, min_size=2, max_size=3).map(lambda c: And(tuple(c))),
        st.lists(kids, min_size=2, max_size=3).map(lambda c: Or(tuple(c))),
        kids.map(Not),
    ),
    max_leaves=5,
)
nullable = lambda s: st.none() | s  # noqa: E731


@settings(max_examples=300, deadline=None)
@given(
    spec_name=st.sampled_from(sorted(SPECS)),
    pred=predicates,
    rows=st.lists(
        st.tuples(*(nullable(col_values[c]) for c in ("i", "s", "d", "t"))), min_size=1, max_size=12
    ),
)
def test_pruning_never_drops_a_region_with_a_matching_row(spec_name, pred, rows):
    table = pa.table(
        {c: [r[k] for r in rows] for k, c in enumerate(("i", "s", "d", "t"))}, schema=SCHEMA
    )
    spec = SPECS[spec_name].bind(SCHEMA)
    region_values = spec.region_values(table)
    regions = {}
    for k, values in enumerate(zip(*(c.to_pylist() for c in region_values.columns))):
        regions.setdefault(values, []).append(k)
    ids = {values: f"r{n}" for n, values in enumerate(regions)}
    kept, _ = prune_regions(pred, spec, SCHEMA, [(ids[v], v) for v in regions])
    hits = evaluate(pred, table).to_pylist()
    for values, members in regions.items():
        if any(hits[k] is True for k in members):
            assert ids[values] in kept, (values, pred)


def _kept(pred, spec, values):
    spec = spec.bind(SCHEMA)
    kept, _ = prune_regions(pred, spec, SCHEMA, [(str(v), (v,)) for v in values])
    return [str(v) in kept for v in values]


def test_pruning_actually_prunes():
    spec = SPECS["bucket_i"].bind(SCHEMA)
    b = spec.region_values(pa.table({"i": pa.array([7], pa.int64())})).column(0)[0].as_py()
    assert _kept(Compare("i", "=", pa.scalar(7)), spec, range(5)) == [v == b for v in range(5)]
    # IN lists of any length are projected value by value.
    many = InList("i", pa.array(range(1000, 6000)))
    assert sum(_kept(many, spec, range(5))) == 5
    assert _kept(
        Compare("d", ">=", pa.scalar(datetime.date(2000, 6, 1))),
        SPECS["year_d"],
        (1999, 2000, 2001),
    ) == [False, True, True]
    ident = SPECS["identity_s"]
    pred = And((InList("s", pa.array(["a", "b"])), Compare("i", ">", pa.scalar(3))))
    assert _kept(pred, ident, ("a", "b", "c")) == [True, True, False]
    assert _kept(Not(InList("s", pa.array(["a"]))), ident, ("a", "b")) == [False, True]
    # Truncate follows the spec's col - (col % W), `%` truncating: -17 lives in region -10.
    assert _kept(Compare("i", "=", pa.scalar(-17)), SPECS["truncate_i"], (-20, -10, 0)) == [
        False,
        True,
        False,
    ]
    # Hour of a fixed-offset timestamp: computed without DataFusion.
    noon = pa.scalar(
        datetime.datetime(2000, 1, 1, 6, 30, tzinfo=datetime.timezone.utc), SCHEMA.field("t").type
    )
    assert _kept(Compare("t", "=", noon), SPECS["hour_t"], (11, 12, 13)) == [False, True, False]
    # A NULL key lives in bucket 0; an SQL expression never prunes (DataFusion would be needed).
    assert _kept(IsNull("i"), spec, range(3)) == [True, False, False]
    assert all(_kept(Compare("i", "=", pa.scalar(4)), SPECS["expression"], (0, 1, 2)))
    assert all(_kept(Opaque(pc.abs(pc.field("i")) == 7), spec, range(5)))


def test_a_pruned_query_opens_only_the_matching_regions_sources(tmp_path):
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), False),
            pa.field("grp", pa.string(), False),
            pa.field("v", pa.string()),
        ]
    )

    def rows(ids, tag):
        return pa.table(
            {"id": ids, "grp": [f"g{i % 4}" for i in ids], "v": [f"{tag}{i}" for i in ids]},
            schema=schema,
        )

    tbl = mw.create_table(
        str(tmp_path),
        schema,
        primary_key="id",
        region_spec=mw.RegionSpec.identity("grp"),
        allow_non_key_region_spec=True,
    )
    ids = list(range(200))
    tbl.upsert(rows(ids, "a"))
    tbl.flush()  # one generation per region
    tbl.upsert(rows(ids[:100], "b"))
    ctx = mw.connect()
    ctx.register("t", tbl)
    got = ctx.sql("SELECT count(*) AS n, min(v) AS v FROM t WHERE grp = 'g2' AND id < 100")
    assert got.to_pydict() == {"n": [25], "v": ["b10"]}
    plan = ctx.last_plan("t")
    assert len(plan.kept_regions) == 1 and len(plan.pruned_regions) == 3
    opened = plan.sources_opened()
    assert {s.region_id for s in opened} == set(plan.kept_regions)
    assert len(opened) == 2  # that region's generation and its MemTable, nothing else
    assert ctx.sql("SELECT count(*) AS n FROM t").to_pydict() == {"n": [200]}
    assert len(ctx.last_plan("t").sources_opened()) == 8
    got = ctx.sql("SELECT id FROM t WHERE grp IN ('g1', 'g3') AND id < 6 ORDER BY id").to_pydict()
    assert got == {"id": [1, 3, 5]}
    assert len(ctx.last_plan("t").kept_regions) == 2
    tbl.close()
