"""Writer options under Lance 14's names, and the table's writer defaults in the MemWAL index."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import InvalidInputError
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.writer.config import WriterConfig

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
PK = {b"lance-schema:unenforced-primary-key": b"true"}


def rows(ids):
    return pa.table({"id": ids, "v": [f"v{i}" for i in ids]}, schema=SCHEMA)


def generations(tbl, rid):
    return len(RegionManifestStore(tbl.store, rid).latest().flushed_generations)


def test_lance_written_writer_defaults_are_honoured(tmp_path):
    schema = pa.schema([SCHEMA.field("id").with_metadata(PK), SCHEMA.field("v")])
    ds = lance.write_dataset(schema.empty_table(), str(tmp_path), schema=schema)
    ds.initialize_mem_wal(
        unsharded=True,
        durable_write=False,
        max_memtable_batches=3,
        max_wal_flush_interval_ms=250,
        max_unflushed_memtable_bytes=1 << 29,
    )
    tbl = mw.open_table(str(tmp_path))
    cfg = tbl.writer_config
    assert (cfg.durable_write, cfg.max_memtable_batches, cfg.max_wal_flush_interval_ms) == (
        False,
        3,
        250,
    )
    assert cfg.max_unflushed_memtable_bytes == 1 << 29
    # Lance's own defaults for what the call left out, since it writes them all.
    assert cfg.max_memtable_rows == 100_000 and cfg.max_wal_buffer_size == 10 << 20
    # And the writer acts on them: a MemTable is frozen at three batches.
    with tbl.writer() as w:
        for i in range(7):
            w.upsert(rows([i]))
        w.flush()
        assert generations(tbl, w.region_id) == 3  # 3 + 3 + the last one
    assert sorted(tbl.to_arrow().column("id").to_pylist()) == list(range(7))
    # A per-writer override still wins over the table's defaults.
    assert tbl.writer(max_memtable_batches=50).config.max_memtable_batches == 50


def test_create_table_records_its_writer_defaults_for_lance_and_later_opens(tmp_path):
    cfg = WriterConfig(durable_write=False, max_memtable_rows=500, max_wal_flush_interval_ms=0)
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id", writer_config=cfg)
    recorded = lance.dataset(str(tmp_path)).mem_wal_index_details()["writer_config_defaults"]
    assert recorded["durable_write"] == "false" and recorded["max_memtable_rows"] == "500"
    assert recorded["max_wal_flush_interval_ms"] == "0"
    assert mw.open_table(str(tmp_path)).writer_config == cfg
    # An explicit config on open replaces the recorded one.
    assert mw.open_table(str(tmp_path), writer_config=WriterConfig()).writer_config.durable_write
    # The defaults of a table created without a config are ours, recorded all the same.
    other = mw.create_table(str(tmp_path / "b"), SCHEMA, primary_key="id")
    assert other.mem_wal_details().writer_config_defaults["max_memtable_rows"] == "1000000"
    tbl.close()


def test_writer_defaults_round_trip_and_bad_values_are_typed_errors():
    cfg = WriterConfig(max_memtable_size=1 << 20, indexed_writes=True)
    assert WriterConfig.from_lance_defaults(cfg.to_lance_defaults()) == cfg
    # Lance-only knobs are read past; nonsense is refused with the option's name.
    assert WriterConfig.from_lance_defaults({"stats_log_interval_ms": "0"}) == WriterConfig()
    for bad in (
        {"durable_write": "yes"},
        {"max_memtable_rows": "many"},
        {"max_memtable_rows": "0"},
    ):
        with pytest.raises(InvalidInputError, match=r"max_memtable_rows|durable_write"):
            WriterConfig.from_lance_defaults(bad)
    with pytest.raises(InvalidInputError, match="max_wal_flush_interval_ms"):
        WriterConfig(max_wal_flush_interval_ms=1.5)
    assert WriterConfig(max_wal_flush_interval_ms=250).max_wal_flush_interval == 0.25
