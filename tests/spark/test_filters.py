"""Spark's pushed filters as predicate trees: taken exactly, or left to Spark."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql import datasource as sds

from memwal_sql.expressions.predicate import Compare, InList, IsNull, Not
from memwal_sql.expressions.visitors import evaluate
from memwal_sql.spark.filters import spark_predicate

SCHEMA = pa.schema(
    [
        ("i", pa.int32()),
        ("s", pa.string()),
        ("f", pa.float64()),
        ("ts", pa.timestamp("us", "UTC")),
        ("d", pa.date32()),
    ]
)
DATA = pa.table(
    {
        "i": pa.array([1, 2, None, 4], pa.int32()),
        "s": ["a", None, "c", "d"],
        "f": [0.5, float("nan"), None, -1.0],
        "ts": pa.array([None] * 4, pa.timestamp("us", "UTC")),
        "d": pa.array([dt.date(2024, 1, 1), None, dt.date(2025, 1, 1), None]),
    },
    schema=SCHEMA,
)


@pytest.mark.parametrize(
    "spark_filter, rows",
    [
        (sds.EqualTo(("i",), 2), [False, True, False, False]),
        (sds.Not(sds.EqualTo(("i",), 2)), [True, False, False, True]),  # NULL stays out
        (sds.GreaterThan(("f",), 0.0), [True, True, False, False]),  # NaN is the greatest
        (sds.In(("s",), ("a", "d", None)), [True, False, False, True]),
        (sds.Not(sds.In(("s",), ("a", None))), [False, False, False, False]),  # NOT IN with NULL
        (sds.IsNull(("i",)), [False, False, True, False]),
        (sds.IsNotNull(("s",)), [True, False, True, True]),
        (sds.EqualNullSafe(("s",), None), [False, True, False, False]),
        (sds.LessThanOrEqual(("d",), dt.date(2024, 6, 1)), [True, False, False, False]),
    ],
)
def test_taken_filters_keep_the_rows_spark_keeps(spark_filter, rows):
    predicate = spark_predicate(spark_filter, SCHEMA)
    assert predicate is not None
    kept = evaluate(predicate, DATA).fill_null(False).to_pylist()
    assert kept == rows


@pytest.mark.parametrize(
    "spark_filter",
    [
        sds.StringStartsWith(("s",), "a"),  # no such node in the tree
        sds.EqualTo(("ts",), dt.datetime(2024, 1, 1)),  # time zones: Spark decides
        sds.EqualTo(("i",), 2**40),  # out of the column's range
        sds.EqualTo(("nested", "x"), 1),  # a nested column
        sds.EqualTo(("unknown",), 1),
    ],
)
def test_other_filters_are_left_to_spark(spark_filter):
    assert spark_predicate(spark_filter, SCHEMA) is None


def test_the_tree_is_what_the_planner_expects():
    assert spark_predicate(sds.IsNotNull(("i",)), SCHEMA) == Not(IsNull("i"))
    assert spark_predicate(sds.EqualTo(("i",), 3), SCHEMA) == Compare(
        "i", "=", pa.scalar(3, pa.int32())
    )
    p = spark_predicate(sds.In(("i",), (1, None)), SCHEMA)
    assert isinstance(p, InList) and p.has_null and p.values.to_pylist() == [1]
