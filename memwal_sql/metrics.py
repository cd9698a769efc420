"""A table's metrics: a typed snapshot (:meth:`MemWalTable.metrics
<memwal_sql.MemWalTable.metrics>`), and the same numbers as OpenTelemetry instruments.

The snapshot is computed on demand from what ``memwal inspect`` reads (each region's manifest,
listings of its directory, the WAL entries no generation holds yet) plus counters that cost
nothing per write: the WAL entries and rows this table object's writers put, and the table's
cache hits, misses and evictions.

Every table opened is observed by instruments on the meter ``memwal_sql`` of OpenTelemetry's
global meter provider, created once per process. With ``opentelemetry-api`` alone they are
no-ops; once an SDK's meter provider is set (before or after the table is opened), each
collection takes one snapshot per table and reports it with the attributes ``memwal.table``
and ``memwal.region``. :func:`instrument` puts the same instruments on a provider that is not
the global one.

Example:
    ``m = tbl.metrics(); m.region(rid).unflushed_rows, m.cache.hits``
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from memwal_sql.errors import InvalidInputError
from memwal_sql.maintenance.status import RegionStatus, region_status
from memwal_sql.structures.cache import default_caches

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

    from memwal_sql.table_state import TableState

log = logging.getLogger(__name__)

METER_NAME = "memwal_sql"


@dataclass(frozen=True)
class RegionMetrics:
    """One region's writes, WAL lag, generations and merge lag.

    ``entries_written`` and ``rows_written`` count what this table object's writers put in
    this process (since it was opened); ``wal_position`` is the newest WAL entry's position,
    which every process's writes advance (one more entry per write or batch of writes, and
    one per claim: its fence).
    """

    region_id: str
    entries_written: int
    rows_written: int
    wal_position: int
    unflushed_wal_entries: int  # WAL data entries in no generation yet
    unflushed_rows: int
    idle_seconds: float  # since the region's newest WAL entry or manifest version
    generations: int  # flushed generations its manifest lists (merged ones until GC)
    unmerged_generations: int
    unmerged_rows: int
    merge_lag_seconds: float  # age of the oldest unmerged generation (0: nothing to merge)
    problem: str | None = None  # damaged: the other storage numbers are 0


@dataclass(frozen=True)
class CacheMetrics:
    """The table's read caches since they were made: ``shared`` when they are the process
    default that every table opened without ``cache=`` shares (their numbers are all
    those tables')."""

    hits: int
    misses: int
    evictions: int
    nbytes: int
    max_bytes: int
    shared: bool


@dataclass(frozen=True)
class TableMetrics:
    """A snapshot of a table's metrics, taken at ``taken_at`` (seconds since the epoch).

    Example:
        ``m = tbl.metrics(); sum(r.unmerged_rows for r in m.regions)``
    """

    uri: str
    taken_at: float
    regions: tuple[RegionMetrics, ...]
    cache: CacheMetrics

    def region(self, region_id: str) -> RegionMetrics:
        """The metrics of ``region_id``.

        Example:
            ``tbl.metrics().region(w.region_id).rows_written``
        """
        for r in self.regions:
            if r.region_id == region_id:
                return r
        raise InvalidInputError(
            f"no region {region_id} in the metrics of {self.uri}; "
            f"its regions: {[r.region_id for r in self.regions][:5]}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def table_metrics(table: TableState, written: Mapping[str, list[int]]) -> TableMetrics:
    """The metrics of ``table``, with ``written``: its writers' ``[entries, rows]`` per region.

    Example:
        ``table_metrics(tbl, {})  # what tbl.metrics() returns, less its own writes``
    """
    taken_at = time.time()
    regions = [_region(s, written.get(s.region_id, (0, 0))) for s in region_status(table)]
    # A region this object wrote that no manifest lists yet is still one it wrote.
    listed = {r.region_id for r in regions}
    regions += [_region(None, counts, rid) for rid, counts in written.items() if rid not in listed]
    caches = table.caches
    stats = caches.stats()
    cache = CacheMetrics(
        stats.hits,
        stats.misses,
        stats.evictions,
        caches.nbytes,
        caches.max_bytes,
        shared=caches is default_caches(),
    )
    return TableMetrics(
        table.uri, taken_at, tuple(sorted(regions, key=lambda r: r.region_id)), cache
    )


def _region(s: RegionStatus | None, written: Iterable[int], region_id: str = "") -> RegionMetrics:
    entries, rows = written
    if s is None:
        return RegionMetrics(region_id, entries, rows, 0, 0, 0, 0.0, 0, 0, 0, 0.0)
    return RegionMetrics(
        region_id=s.region_id,
        entries_written=entries,
        rows_written=rows,
        wal_position=s.wal_position,
        unflushed_wal_entries=s.unflushed_wal_entries,
        unflushed_rows=s.unflushed_rows,
        idle_seconds=s.idle_seconds,
        generations=len(s.flushed_generations),
        unmerged_generations=s.unmerged_generations,
        unmerged_rows=s.unmerged_rows,
        merge_lag_seconds=s.merge_lag_seconds,
        problem=s.problem,
    )


# ---- OpenTelemetry --------------------------------------------------------------------------


class Observed(Protocol):
    """What the instruments observe: a table that can take its metrics snapshot."""

    uri: str

    def metrics(self) -> TableMetrics: ...


class _Watch:
    """One observed table's latest snapshot, shared by the instruments of one collection: an
    instrument asking again means a new collection, so the snapshot is taken again (no clock,
    so two quick collections never see a stale one). A snapshot that failed is None for the
    rest of the collection, so a table whose storage is down costs one try, not one per
    instrument."""

    def __init__(self) -> None:
        self.snapshot: TableMetrics | None = None
        self.read_by: set[str] | None = None  # None: no snapshot tried yet


_lock = threading.Lock()
_tables: weakref.WeakKeyDictionary[Observed, _Watch] = weakref.WeakKeyDictionary()
_providers: list[object] = []  # providers (None: the global one) already instrumented

# Region instruments: name, unit, description, value; the first three are counters (they only
# grow), the others gauges.
_REGION: tuple[tuple[str, str, str, Callable[[RegionMetrics], float]], ...] = (
    ("memwal.region.entries_written", "{entry}", "WAL entries this process's writers put",
     lambda r: r.entries_written),
    ("memwal.region.rows_written", "{row}", "rows this process's writers put",
     lambda r: r.rows_written),
    ("memwal.region.wal_position", "{entry}", "the newest WAL entry's position (every writer's)",
     lambda r: r.wal_position),
    ("memwal.region.unflushed_wal_entries", "{entry}", "WAL data entries in no generation yet",
     lambda r: r.unflushed_wal_entries),
    ("memwal.region.unflushed_rows", "{row}", "WAL rows in no generation yet",
     lambda r: r.unflushed_rows),
    ("memwal.region.idle", "s", "time since the region's last WAL entry or manifest version",
     lambda r: r.idle_seconds),
    ("memwal.region.generations", "{generation}", "flushed generations in the manifest",
     lambda r: r.generations),
    ("memwal.region.unmerged_generations", "{generation}", "generations not merged yet",
     lambda r: r.unmerged_generations),
    ("memwal.region.unmerged_rows", "{row}", "rows of generations not merged yet",
     lambda r: r.unmerged_rows),
    ("memwal.region.merge_lag", "s", "age of the oldest unmerged generation",
     lambda r: r.merge_lag_seconds),
)  # fmt: skip
_REGION_COUNTERS = 3
# Cache instruments, the same way: hits, misses and evictions are counters, bytes a gauge.
_CACHE: tuple[tuple[str, str, str, Callable[[CacheMetrics], float]], ...] = (
    ("memwal.cache.hits", "{hit}", "cache answers from memory", lambda c: c.hits),
    ("memwal.cache.misses", "{miss}", "cache answers that loaded", lambda c: c.misses),
    ("memwal.cache.evictions", "{eviction}", "entries evicted to stay in budget",
     lambda c: c.evictions),
    ("memwal.cache.bytes", "By", "bytes the cache holds", lambda c: c.nbytes),
)  # fmt: skip
_CACHE_COUNTERS = 3


def observe(table: Observed) -> None:
    """Report ``table``'s metrics through the instruments (done when a table is opened)
    until it is closed (:func:`forget`) or garbage-collected. The global provider's
    instruments are created at the first table opened once the application has imported
    OpenTelemetry (or by :func:`instrument`): importing it costs a cold query tens of
    milliseconds, which a process that does not use it should not pay.

    Example:
        ``observe(tbl)``
    """
    with _lock:
        _tables.setdefault(table, _Watch())
    if "opentelemetry.metrics" in sys.modules:
        instrument()


def instrument(meter_provider: MeterProvider | None = None) -> None:
    """Create the instruments on ``meter_provider``'s meter ``memwal_sql`` (the global
    provider's: None), once per provider; they observe every table opened in this process.

    Example:
        >>> from opentelemetry.sdk.metrics import MeterProvider
        >>> from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        >>> reader = InMemoryMetricReader()
        >>> instrument(MeterProvider(metric_readers=[reader]))
    """
    with _lock:
        if any(p is meter_provider for p in _providers):
            return
        _providers.append(meter_provider)
    from opentelemetry import metrics

    meter = metrics.get_meter(METER_NAME, meter_provider=meter_provider)
    counter, gauge = meter.create_observable_counter, meter.create_observable_gauge
    for i, (name, unit, text, value) in enumerate(_REGION):
        (counter if i < _REGION_COUNTERS else gauge)(name, [_regions(name, value)], unit, text)
    for i, (name, unit, text, cache_value) in enumerate(_CACHE):
        (counter if i < _CACHE_COUNTERS else gauge)(name, [_caches(name, cache_value)], unit, text)


def forget(table: Observed) -> None:
    """Stop reporting ``table``'s metrics (done when it is closed).

    Example:
        ``forget(tbl)``
    """
    with _lock:
        _tables.pop(table, None)


def _snapshots(instrument_name: str) -> list[TableMetrics]:
    """Each observed table's snapshot for this collection of ``instrument_name``."""
    with _lock:
        tables = list(_tables.items())
    out = []
    for table, watch in tables:
        with _lock:
            stale = watch.read_by is None or instrument_name in watch.read_by
        if stale:
            snapshot = None
            try:
                snapshot = table.metrics()
            except Exception as e:  # one table's storage failing must not hide the others
                log.warning("memwal_sql metrics of %s not collected: %s", table.uri, e)
            with _lock:
                watch.snapshot, watch.read_by = snapshot, set()
        with _lock:
            if watch.read_by is not None:
                watch.read_by.add(instrument_name)
            snapshot = watch.snapshot
        if snapshot is not None:
            out.append(snapshot)
    return out


def _regions(
    name: str, value: Callable[[RegionMetrics], float]
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    from opentelemetry.metrics import Observation

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(value(r), {"memwal.table": m.uri, "memwal.region": r.region_id})
            for m in _snapshots(name)
            for r in m.regions
            if r.problem is None
        ]

    return observe


def _caches(
    name: str, value: Callable[[CacheMetrics], float]
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    from opentelemetry.metrics import Observation

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        # Tables sharing the process default caches report them once, as "default".
        seen: dict[str, CacheMetrics] = {}
        for m in _snapshots(name):
            seen.setdefault("default" if m.cache.shared else m.uri, m.cache)
        return [Observation(value(c), {"memwal.caches": key}) for key, c in seen.items()]

    return observe
