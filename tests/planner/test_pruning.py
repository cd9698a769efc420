"""Region pruning: never drops a region that holds a matching row, and does prune."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.index.region_spec import RegionSpec
from planner.pruning import may_match, parse_filter

SCHEMA = pa.schema([("i", pa.int64()), ("s", pa.string()), ("d", pa.date32())])
SPECS = {
    "bucket_i": RegionSpec.bucket("i", 5),
    "bucket_s": RegionSpec.bucket("s", 3),
    "identity_s": RegionSpec.identity("s"),
    "identity_i": RegionSpec.identity("i"),
    "year_d": RegionSpec.year("d"),
    "month_d": RegionSpec.month("d"),
    "truncate_i": RegionSpec.truncate("i", 10),
    "truncate_s": RegionSpec.truncate("s", 1),
}
ints = st.integers(-50, 50)
strs = st.text(alphabet="abc", max_size=3)
dates = st.dates(min_value=datetime.date(1999, 11, 1), max_value=datetime.date(2001, 2, 1))
col_values = {"i": ints, "s": strs, "d": dates}


@st.composite
def predicate(draw):
    col = draw(st.sampled_from(["i", "s", "d"]))
    typ = SCHEMA.field(col).type
    kind = draw(st.sampled_from(["cmp", "in", "and", "or", "not"]))
    if kind == "in":
        return pc.field(col).isin(pa.array(draw(st.lists(col_values[col], min_size=1, max_size=3)), typ))
    if kind in ("and", "or", "not"):
        a, b = draw(predicate()), draw(predicate())
        return a & b if kind == "and" else (a | b if kind == "or" else ~a)
    op = draw(st.sampled_from(["eq", "ne", "lt", "le", "gt", "ge"]))
    return getattr(pc.field(col), f"__{op}__")(pa.scalar(draw(col_values[col]), typ))


@settings(max_examples=120, deadline=None)
@given(spec_name=st.sampled_from(sorted(SPECS)), expr=predicate(),
       rows=st.lists(st.tuples(ints, strs, dates), min_size=1, max_size=12))
def test_pruning_never_drops_a_region_with_a_matching_row(spec_name, expr, rows):
    table = pa.table({"i": [r[0] for r in rows], "s": [r[1] for r in rows],
                      "d": [r[2] for r in rows]}, schema=SCHEMA)
    spec = SPECS[spec_name].bind(SCHEMA)
    node = parse_filter(expr, SCHEMA)
    region_values = spec.region_values(table).column(0).to_pylist()
    matches = table.append_column("rv", pa.array(region_values)).filter(expr)
    for rv in set(matches.column("rv").to_pylist()):
        assert may_match(node, spec, (rv,), SCHEMA), (rv, str(expr))


def test_pruning_actually_prunes():
    f = pc.field
    spec = SPECS["bucket_i"].bind(SCHEMA)
    b = spec.region_values(pa.table({"i": pa.array([7], pa.int64())})).column(0)[0].as_py()
    node = parse_filter(f("i") == 7, SCHEMA)
    assert [may_match(node, spec, (v,), SCHEMA) for v in range(5)] == [v == b for v in range(5)]
    year = SPECS["year_d"].bind(SCHEMA)
    node = parse_filter(f("d") >= pa.scalar(datetime.date(2000, 6, 1)), SCHEMA)
    assert [may_match(node, year, (y,), SCHEMA) for y in (1999, 2000, 2001)] == [False, True, True]
    ident = SPECS["identity_s"].bind(SCHEMA)
    node = parse_filter(f("s").isin(["a", "b"]) & (f("i") > 3), SCHEMA)
    assert [may_match(node, ident, (v,), SCHEMA) for v in ("a", "b", "c")] == [True, True, False]
    # Unknown parts never prune.
    node = parse_filter(pc.abs(f("i")) == 7, SCHEMA)
    assert all(may_match(node, spec, (v,), SCHEMA) for v in range(5))


def test_a_pruned_query_opens_only_the_matching_regions_sources(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("grp", pa.string(), False),
                        pa.field("v", pa.string())])

    def rows(ids, tag):
        return pa.table({"id": ids, "grp": [f"g{i % 4}" for i in ids],
                         "v": [f"{tag}{i}" for i in ids]}, schema=schema)

    tbl = mw.create_table(str(tmp_path), schema, primary_key="id",
                          region_spec=mw.RegionSpec.identity("grp"))
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
