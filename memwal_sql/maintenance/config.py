"""The settings of maintenance, in one frozen value: every job and pass takes one.

Example:
    >>> from datetime import timedelta
    >>> from memwal_sql.maintenance.config import MaintenanceConfig
    >>> cfg = MaintenanceConfig(keep_manifest_versions=3)
    >>> cfg.keep_manifest_versions, cfg.deletion_threshold
    (3, 0.1)
    >>> later = cfg.updated(base_versions_older_than=timedelta(hours=2), deletion_threshold=None)
    >>> later.keep_manifest_versions, later.base_versions_older_than, later.deletion_threshold
    (3, datetime.timedelta(seconds=7200), 0.1)
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import timedelta

from memwal_sql.errors import InvalidInputError

TARGET_ROWS_PER_FRAGMENT = 1 << 20  # Lance's default
# Lance's default; Delta Lake's 5% keeps two rewritten copies within an hour: compaction.py.
DELETION_THRESHOLD = 0.10
SMALL_FRAGMENT_TRIGGER = 8  # small fragments a maintenance pass waits for (compaction.py)
# How long a superseded base version stays readable: Paimon keeps snapshots an hour (docs/
# maintenance.md#retention says why an hour, counted from when a version stopped being latest).
BASE_VERSION_RETENTION = timedelta(hours=1)
# How long a region with unflushed WAL entries must see no write before maintenance takes it
# over: far beyond any pause of a live writer (whose next write it would fence).
RECOVER_REGIONS_IDLE_FOR = timedelta(minutes=30)


@dataclass(frozen=True)
class MaintenanceConfig:
    """How maintenance merges, compacts and collects; the defaults suit most tables.

    - ``keep_manifest_versions``: region manifest versions the collector keeps per region
      (besides the one the WAL hint names; 0 keeps them all).
    - ``base_versions_older_than``: the collector first drops base-table versions superseded
      longer ago than this (an hour; Lance's ``cleanup_old_versions``, which keeps tagged
      versions); ``None`` keeps every version, and the generations they list stay.
    - ``target_rows_per_fragment``: compaction merges smaller base fragments up to this size.
    - ``deletion_threshold``: compaction rewrites a fragment once this share of its rows is
      deleted (0.0 removes every deletion vector).
    - ``small_fragment_trigger``: a maintenance pass compacts only once this many fragments are
      below a size tier's bound (its square in rows, its cube, ...; then only those are merged)
      or one reached the threshold; an explicit compaction compacts whatever there is.
    - ``max_generations_per_region``: a merge pass merges at most this many generations of
      each region (``None``: all of them).
    - ``recover_regions_idle_for``: a maintenance pass takes over a region whose WAL holds
      unflushed entries and which saw no WAL or manifest write for this long (30 minutes),
      as a writer that exited without ``close()`` leaves it: it claims the region (fencing
      any writer left), replays, flushes and releases it. ``None`` never does.

    Example:
        ``tbl.maintenance.run(MaintenanceConfig(base_versions_older_than=timedelta(hours=2)))``
    """

    keep_manifest_versions: int = 10
    base_versions_older_than: timedelta | None = BASE_VERSION_RETENTION
    target_rows_per_fragment: int = TARGET_ROWS_PER_FRAGMENT
    deletion_threshold: float = DELETION_THRESHOLD
    small_fragment_trigger: int = SMALL_FRAGMENT_TRIGGER
    max_generations_per_region: int | None = None
    recover_regions_idle_for: timedelta | None = RECOVER_REGIONS_IDLE_FOR

    def __post_init__(self) -> None:
        if self.keep_manifest_versions < 0:
            raise InvalidInputError(
                f"keep_manifest_versions must be 0 (keep all) or more, "
                f"not {self.keep_manifest_versions}"
            )
        for name in ("base_versions_older_than", "recover_regions_idle_for"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, timedelta):
                raise InvalidInputError(f"{name} is a datetime.timedelta (or None), not {value!r}")
        if self.target_rows_per_fragment < 1:
            raise InvalidInputError(
                f"target_rows_per_fragment must be at least 1, not {self.target_rows_per_fragment}"
            )
        if not 0.0 <= self.deletion_threshold <= 1.0:
            raise InvalidInputError(
                f"deletion_threshold is a share of a fragment's rows, from 0.0 to 1.0, "
                f"not {self.deletion_threshold}"
            )
        if self.small_fragment_trigger < 1:
            raise InvalidInputError(
                f"small_fragment_trigger must be at least 1, not {self.small_fragment_trigger}"
            )
        if self.max_generations_per_region is not None and self.max_generations_per_region < 1:
            raise InvalidInputError(
                f"max_generations_per_region must be at least 1 (or None for all), "
                f"not {self.max_generations_per_region}"
            )

    def updated(self, **changes: object) -> MaintenanceConfig:
        """This config with the given fields changed; a change of ``None`` keeps the field as it
        is (so optional keyword arguments can be passed straight through).

        Example:
            ``tbl.maintenance.config.updated(deletion_threshold=0.0)``
        """
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InvalidInputError(
                f"MaintenanceConfig has no setting(s) {unknown}; it has {sorted(known)}"
            )
        return replace(self, **{k: v for k, v in changes.items() if v is not None})  # type: ignore[arg-type]
