"""Background maintenance: recovering regions whose writer is gone, merging generations into the base table, index catch-up, base-table
compaction, region snapshots, garbage collection, a scrub for damage, and schema evolution."""

from memwal_sql.maintenance.compaction import CompactionResult, compact_base
from memwal_sql.maintenance.config import MaintenanceConfig
from memwal_sql.maintenance.gc import GcResult, gc_table
from memwal_sql.maintenance.index_builder import SnapshotResult, build_region_snapshots
from memwal_sql.maintenance.indexes import CatchupResult, catch_up_indexes
from memwal_sql.maintenance.merger import MergeResult, merge_region, merge_table
from memwal_sql.maintenance.recovery import (
    RecoveryResult,
    WalBacklog,
    recover_regions,
    wal_backlog,
)
from memwal_sql.maintenance.run import MaintenanceResult, StepFailure, maintain_table
from memwal_sql.maintenance.schema import add_columns, alter_columns
from memwal_sql.maintenance.status import RegionStatus, region_status
from memwal_sql.maintenance.table_maintenance import TableMaintenance
from memwal_sql.maintenance.verify import Problem, VerifyReport, verify_table

__all__ = [
    "CatchupResult",
    "CompactionResult",
    "GcResult",
    "MaintenanceConfig",
    "MaintenanceResult",
    "MergeResult",
    "Problem",
    "RecoveryResult",
    "RegionStatus",
    "SnapshotResult",
    "StepFailure",
    "TableMaintenance",
    "VerifyReport",
    "WalBacklog",
    "add_columns",
    "alter_columns",
    "build_region_snapshots",
    "catch_up_indexes",
    "compact_base",
    "gc_table",
    "maintain_table",
    "merge_region",
    "merge_table",
    "recover_regions",
    "region_status",
    "verify_table",
    "wal_backlog",
]
