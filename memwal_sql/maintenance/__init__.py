"""Background maintenance: merging generations into the base table, garbage collection."""

from memwal_sql.maintenance.gc import GcResult, gc_table
from memwal_sql.maintenance.merger import MergeResult, merge_region, merge_table

__all__ = ["GcResult", "MergeResult", "gc_table", "merge_region", "merge_table"]
