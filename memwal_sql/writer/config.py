"""Writer options, named as Lance 14's ``mem_wal_writer`` and ``initialize_mem_wal`` name them.

A table carries its writers' defaults in the MemWAL index (``writer_config_defaults``, a map of
strings, as Lance's ``initialize_mem_wal`` writes it); :meth:`WriterConfig.from_lance_defaults`
reads that map and :meth:`WriterConfig.to_lance_defaults` writes it.

Example:
    >>> cfg = WriterConfig(durable_write=False).with_overrides(max_memtable_rows=10)
    >>> cfg.max_memtable_rows, cfg.to_lance_defaults()["durable_write"]
    (10, 'false')
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from memwal_sql.errors import InvalidInputError

_log = logging.getLogger(__name__)

# Lance's writer options that have no counterpart here: read and left alone.
_LANCE_ONLY = frozenset(
    {
        "manifest_scan_batch_size",
        "backpressure_log_interval_ms",
        "stats_log_interval_ms",
        "max_wal_persist_retries",
        "wal_persist_retry_base_delay_ms",
        "enable_memtable",
        "hnsw_params",
    }
)
_FLAGS = ("durable_write", "indexed_writes")
_MAY_BE_ZERO = ("max_wal_flush_interval_ms",)  # zero: put at once


@dataclass(frozen=True)
class WriterConfig:
    """Thresholds of a region writer. The first seven are Lance 14's writer options, with its
    names and units; the last two are memwal-sql's own.

    Example:
        >>> WriterConfig(durable_write=False).with_overrides(max_memtable_rows=10).max_memtable_rows
        10
    """

    durable_write: bool = True
    """Return from a write only once its WAL entry is stored (Lance: same)."""
    max_wal_buffer_size: int = 10 << 20
    """Bytes of non-durable writes buffered before a WAL put (Lance: 10 MiB)."""
    max_wal_flush_interval_ms: int = 100
    """Milliseconds a non-durable write may wait in the WAL buffer (Lance: 100)."""
    max_memtable_size: int = 256 << 20
    """MemTable bytes at which it is frozen and flushed as a generation (Lance: 256 MiB)."""
    max_memtable_rows: int = 1_000_000
    """MemTable rows at which it is frozen (Lance: 100,000; see the README for why more)."""
    max_memtable_batches: int = 8_000
    """MemTable batches at which it is frozen (Lance: 8,000)."""
    max_unflushed_memtable_bytes: int = 1 << 30
    """Writes block (backpressure) while frozen MemTables hold more than this (Lance: 1 GiB)."""
    max_wal_buffer_batches: int = 256
    """Non-durable writes buffered before a WAL put (memwal-sql only)."""
    indexed_writes: bool = False
    """Bring the MemTable's in-memory indexes (the table's maintained vector and inverted
    indexes) up to date before a write returns (the spec's indexed write); otherwise the
    first search after a write does it (memwal-sql only)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _FLAGS:
                if not isinstance(v, bool):
                    raise InvalidInputError(f"{f.name} must be True or False, not {v!r}")
                continue
            least = 0 if f.name in _MAY_BE_ZERO else 1
            if (
                isinstance(v, bool)
                or not isinstance(v, numbers.Real)
                or not math.isfinite(v)
                or v < least
                or v != math.floor(v)
            ):
                raise InvalidInputError(f"{f.name} must be a whole number >= {least}, not {v!r}")

    @property
    def max_wal_flush_interval(self) -> float:
        """:attr:`max_wal_flush_interval_ms` in seconds."""
        return self.max_wal_flush_interval_ms / 1000

    def with_overrides(self, **overrides: Any) -> WriterConfig:
        """A copy with ``overrides`` applied (``None`` values are ignored).

        Example:
            >>> WriterConfig().with_overrides(durable_write=None).durable_write
            True
        """
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise InvalidInputError(
                f"unknown writer option(s) {unknown}; the options are "
                f"{[f.name for f in fields(self)]}"
            )
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @classmethod
    def from_lance_defaults(cls, defaults: Mapping[str, str]) -> WriterConfig:
        """The config a table's ``writer_config_defaults`` map describes (values are strings,
        as Lance writes them); options Lance has and memwal-sql does not are ignored.

        Example:
            >>> WriterConfig.from_lance_defaults({"durable_write": "false"}).durable_write
            False
        """
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, text in defaults.items():
            if key in _FLAGS:
                if text.lower() not in ("true", "false"):
                    raise InvalidInputError(
                        f"writer_config_defaults[{key!r}] is {text!r}, not true or false"
                    )
                values[key] = text.lower() == "true"
            elif key in known:
                try:
                    values[key] = int(text)
                except ValueError:
                    raise InvalidInputError(
                        f"writer_config_defaults[{key!r}] is {text!r}, not a whole number"
                    ) from None
            elif key not in _LANCE_ONLY:
                _log.warning("writer_config_defaults: unknown option %r ignored", key)
        return cls(**values)

    def to_lance_defaults(self) -> dict[str, str]:
        """Every option as a string, the form of the MemWAL index's ``writer_config_defaults``.

        Example:
            >>> WriterConfig().to_lance_defaults()["max_wal_flush_interval_ms"]
            '100'
        """
        return {
            f.name: (str(v).lower() if isinstance(v, bool) else str(int(v)))
            for f in fields(self)
            for v in [getattr(self, f.name)]
        }


__all__ = ["WriterConfig"]
