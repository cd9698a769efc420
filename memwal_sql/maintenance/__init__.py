"""Background maintenance: merging flushed generations into the base table."""

from memwal_sql.maintenance.merger import MergeResult, merge_region, merge_table

__all__ = ["MergeResult", "merge_region", "merge_table"]
