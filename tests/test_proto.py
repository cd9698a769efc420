"""The checked-in protobuf module must be what proto/memwal.proto generates."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from google.protobuf.unknown_fields import UnknownFieldSet

from memwal_sql._proto import memwal_pb2

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_generated_module_is_current(tmp_path):
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(ROOT / "proto" / "memwal.proto"),
        ],
        check=True,
    )
    for name in ("memwal_pb2.py", "memwal_pb2.pyi"):
        fresh = (tmp_path / name).read_text()
        stored = (ROOT / "memwal_sql" / "_proto" / name).read_text()
        assert fresh == stored, (
            f"memwal_sql/_proto/{name} is stale: run `make proto` and commit the result"
        )


def test_field_numbers_match_the_seed_spec_and_lance():
    m = memwal_pb2.RegionManifest.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in m.items()} == {
        "version": 1,
        "writer_epoch": 2,
        "replay_after_wal_entry_position": 3,
        "wal_entry_position_last_seen": 4,
        "current_generation": 6,
        "flushed_generations": 8,
        "region_spec_id": 10,
        "region_id": 11,
        "region_field_entries": 14,
        "status": 15,
    }
    d = memwal_pb2.MemWalIndexDetails.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in d.items()} == {
        "snapshot_ts_millis": 1,
        "num_regions": 2,
        "inline_snapshots": 3,
        "region_specs": 7,
        "maintained_indexes": 8,
        "merged_generations": 9,
        "index_catchup": 10,
        "writer_config_defaults": 11,
        "maintain_all_indexes": 12,
    }
    assert memwal_pb2.MemWalIndexDetails.DESCRIPTOR.full_name == "lance.table.MemWalIndexDetails"


def test_lance_written_manifest_round_trips_byte_identically(tmp_path):
    """Decode a manifest Lance's own writer produced, re-encode it, and compare bytes."""
    import uuid

    import lance
    import pyarrow as pa

    schema = pa.schema(
        [
            pa.field(
                "id", pa.int64(), False, metadata={"lance-schema:unenforced-primary-key": "true"}
            )
        ]
    )
    ds = lance.write_dataset(pa.table({"id": [1]}, schema=schema), str(tmp_path / "t"))
    ds.initialize_mem_wal()
    rid = str(uuid.uuid4())
    with lance.dataset(str(tmp_path / "t")).mem_wal_writer(rid) as w:
        w.put(pa.table({"id": [2, 3]}, schema=schema))
    manifests = sorted((tmp_path / "t" / "_mem_wal" / rid / "manifest").glob("*.binpb"))
    assert manifests
    for path in manifests:
        raw = path.read_bytes()
        m = memwal_pb2.RegionManifest.FromString(raw)
        assert m.SerializeToString() == raw
        assert len(UnknownFieldSet(m)) == 0  # every field Lance writes is known to us
        for g in m.flushed_generations:
            assert len(UnknownFieldSet(g)) == 0
    assert any(
        len(memwal_pb2.RegionManifest.FromString(p.read_bytes()).flushed_generations)
        for p in manifests
    )
