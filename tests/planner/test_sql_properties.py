"""Generated predicates through SQL and through ``filter=`` over a table of every region-spec
transform: the rows equal plain DataFusion's over the latest rows, and an ``=``/``IN`` on a
bucket, identity or date-part column reads only the regions that can hold its values."""

from __future__ import annotations

import datetime

import datafusion
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.partitioning.region_spec import region_id_for
from tests.planner.test_sql_by_transform import SCHEMA, SPECS, N, build

pytestmark = pytest.mark.slow

VALUES = {
    "id": st.integers(-5, N + 5),
    "k": st.integers(-35, 35),
    "v": st.integers(0, 4),
    "s": st.sampled_from(["a", "b", "C:\\x", "e", "it's", "z"]),
    "d": st.dates(min_value=datetime.date(1999, 12, 1), max_value=datetime.date(2004, 1, 31)),
    "ts": st.datetimes(
        min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2000, 2, 10)
    ).map(lambda t: t.replace(minute=0, second=0, microsecond=0)),
}


def literal(col: str, value: object) -> str:
    if col == "s":
        return "'" + str(value).replace("'", "''") + "'"
    if col == "d":
        return f"DATE '{value.isoformat()}'"  # type: ignore[attr-defined]
    if col == "ts":
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"  # type: ignore[attr-defined]
    return str(value)


@st.composite
def atom(draw: st.DrawFn) -> str:
    col = draw(st.sampled_from(sorted(VALUES)))
    kind = draw(st.sampled_from(["cmp", "in", "null"]))
    if kind == "null":
        return f"{col} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == "in":
        n = (
            draw(st.sampled_from([1, 3, 8, 200, 5000]))
            if col in ("id", "k")
            else draw(st.integers(1, 8))
        )
        values = [draw(VALUES[col]) for _ in range(min(n, 8))]
        if n > 8:  # long lists: a run of integers around the drawn ones
            values += list(range(n - len(values)))
        neg = draw(st.sampled_from(["", "NOT "]))
        return f"{col} {neg}IN ({', '.join(literal(col, x) for x in values)})"
    op = draw(st.sampled_from(["=", "<>", "<", "<=", ">", ">="]))
    return f"{col} {op} {literal(col, draw(VALUES[col]))}"


predicates = st.recursive(
    atom(),
    lambda kids: st.one_of(
        st.tuples(kids, kids).map(lambda t: f"({t[0]} AND {t[1]})"),
        st.tuples(kids, kids).map(lambda t: f"({t[0]} OR {t[1]})"),
        kids.map(lambda p: f"(NOT {p})"),
    ),
    max_leaves=4,
)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    out = {}
    for name, spec in SPECS.items():
        tbl, latest = build(str(tmp_path_factory.mktemp(name)), spec)
        plain = datafusion.SessionContext()
        plain.register_record_batches("t", [latest.to_batches()])
        ctx = mw.connect()
        ctx.register("t", tbl)
        out[name] = (tbl, ctx, plain)
    yield out
    for tbl, _, _ in out.values():
        tbl.close()


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=st.sampled_from(sorted(SPECS)), where=predicates)
def test_generated_predicates_match_plain_datafusion(tables, spec, where):
    tbl, ctx, plain = tables[spec]
    q = f"SELECT * FROM t WHERE {where} ORDER BY id"
    got = ctx.sql(q).to_arrow_table()
    want = plain.sql(q).to_arrow_table().cast(got.schema)
    assert got.to_pylist() == want.to_pylist(), (spec, where)
    assert tbl.to_arrow(filter=where).sort_by("id").to_pylist() == want.to_pylist()


PRUNABLE = {
    "bucket": "id",
    "identity": "k",
    "year": "d",
    "month": "d",
    "day": "ts",
    "hour": "ts",
    "truncate": "k",
}


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(spec=st.sampled_from(sorted(PRUNABLE)), data=st.data())
def test_equality_and_in_read_only_the_matching_regions(tables, spec, data):
    tbl, ctx, _ = tables[spec]
    col = PRUNABLE[spec]
    # DataFusion does not push an IN list of 4+ dates or timestamps (see tests/compat).
    values = data.draw(st.lists(VALUES[col], min_size=1, max_size=3 if col in ("d", "ts") else 6))
    where = (
        f"{col} = {literal(col, values[0])}"
        if len(values) == 1
        else f"{col} IN ({', '.join(literal(col, v) for v in values)})"
    )
    ctx.sql(f"SELECT count(*) FROM t WHERE {where}").collect()
    plan = ctx.last_plan("t")
    if col == "id":  # a key predicate is a point lookup: every region it probes is a match
        probed = {r.label.split()[-1] for r in plan.root.regions}
        wanted = {
            region_id_for(tbl.region_spec, (b,))[:8]
            for b in tbl.region_spec.region_values(pa.table({"id": values})).column(0).to_pylist()
        }
        assert probed <= wanted
        return
    bound = tbl.region_spec
    region_values = bound.region_values(pa.table({col: pa.array(values, SCHEMA.field(col).type)}))
    wanted = {region_id_for(bound, (v,)) for v in region_values.column(0).to_pylist()}
    assert set(plan.kept_regions) == wanted & set(tbl.regions()), where
    assert {s.region_id for s in plan.sources_opened()} <= set(plan.kept_regions)
