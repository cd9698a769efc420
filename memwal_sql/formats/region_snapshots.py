"""Region snapshots: every region's manifest as one row of a Lance file (spec 003, "Region
Snapshot Arrow Schema").

The snapshot is what eventual-consistency readers read instead of each region manifest. It is
stored inline in the MemWAL index details (``inline_snapshots``, the Lance file's bytes) for up
to :data:`INLINE_THRESHOLD` regions, and as ``_indices/{uuid}/index.lance`` beyond that.

Example:
    ``manifests_from_table(snapshot_table(manifests, spec))``
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Sequence

import pyarrow as pa
from lance.file import LanceFileReader, LanceFileWriter

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails, RegionManifest
from memwal_sql.errors import CorruptManifestError, MemWalError
from memwal_sql.partitioning.region_spec import RegionSpec

INLINE_THRESHOLD = 100
FIELD_PREFIX = "region_field_"

_GENERATION = pa.struct([("generation", pa.uint64()), ("path", pa.string())])
BASE_SCHEMA = pa.schema(
    [
        ("region_id", pa.binary(16)),
        ("version", pa.uint64()),
        ("region_spec_id", pa.uint32()),
        ("writer_epoch", pa.uint64()),
        ("replay_after_wal_entry_position", pa.uint64()),
        ("wal_entry_position_last_seen", pa.uint64()),
        ("current_generation", pa.uint64()),
        ("flushed_generations", pa.list_(_GENERATION)),
    ]
)


def snapshot_schema(spec: RegionSpec | None) -> pa.Schema:
    """The snapshot schema: the manifest columns, then ``region_field_{field_id}`` per field."""
    if spec is None or not spec.fields:
        return BASE_SCHEMA
    extra = [
        pa.field(FIELD_PREFIX + f.field_id, t) for f, t in zip(spec.fields, spec.result_types())
    ]
    return pa.schema([*BASE_SCHEMA, *extra])


def snapshot_table(manifests: Sequence[RegionManifest], spec: RegionSpec | None) -> pa.Table:
    """One row per region manifest (region field values typed; NULL where a region has none)."""
    schema = snapshot_schema(spec)
    cols: dict[str, list[object]] = {f.name: [] for f in schema}
    for m in manifests:
        cols["region_id"].append(m.region_id.uuid)
        for name in (
            "version",
            "region_spec_id",
            "writer_epoch",
            "replay_after_wal_entry_position",
            "wal_entry_position_last_seen",
            "current_generation",
        ):
            cols[name].append(getattr(m, name))
        cols["flushed_generations"].append(
            [{"generation": g.generation, "path": g.path} for g in m.flushed_generations]
        )
        if spec is not None and spec.fields:
            values = spec.values_from_entries(
                [(e.field_id, e.value) for e in m.region_field_entries]
            )
            for i, f in enumerate(spec.fields):
                cols[FIELD_PREFIX + f.field_id].append(None if values is None else values[i])
    return pa.Table.from_pydict(cols, schema=schema)


def manifests_from_table(table: pa.Table, spec: RegionSpec | None) -> list[RegionManifest]:
    """Invert :func:`snapshot_table`."""
    fields = list(spec.fields) if spec is not None else []
    out = []
    for row in table.to_pylist():
        m = RegionManifest(
            version=row["version"],
            region_spec_id=row["region_spec_id"],
            writer_epoch=row["writer_epoch"],
            replay_after_wal_entry_position=row["replay_after_wal_entry_position"],
            wal_entry_position_last_seen=row["wal_entry_position_last_seen"],
            current_generation=row["current_generation"],
        )
        m.region_id.uuid = row["region_id"]
        for g in row["flushed_generations"] or []:
            m.flushed_generations.add(generation=g["generation"], path=g["path"])
        values = [row.get(FIELD_PREFIX + f.field_id) for f in fields]
        if fields and all(v is not None for v in values):
            assert spec is not None
            for field_id, value in spec.field_entries(values):
                m.region_field_entries.add(field_id=field_id, value=value)
        out.append(m)
    return out


_SNAPSHOT_NAMESPACE = uuid.UUID("0b6c3f5e-52a4-4d43-8f0e-6d656d77616c")


def external_snapshot_path(snapshot_ts_millis: int) -> str:
    """Where the snapshot taken at ``snapshot_ts_millis`` lives when it is not inline:
    ``_indices/{uuid}/index.lance``, the uuid derived from the timestamp. Lance 14 gives the
    MemWAL index a new uuid on every merge but keeps the snapshot fields, so readers find the
    file from the fields, not from the index's uuid."""
    return f"_indices/{uuid.uuid5(_SNAPSHOT_NAMESPACE, str(snapshot_ts_millis))}/index.lance"


def write_lance_file(
    table: pa.Table, uri: str, storage_options: dict[str, str] | None = None
) -> None:
    """Write ``table`` as one Lance file at ``uri``."""
    writer = LanceFileWriter(uri, table.schema, storage_options=storage_options)
    writer.write_batch(table)
    writer.close()


def read_lance_file(uri: str, storage_options: dict[str, str] | None = None) -> pa.Table:
    """Read a whole Lance file (a missing or damaged file raises CorruptManifestError)."""
    try:
        return LanceFileReader(uri, storage_options=storage_options).read_all().to_table()
    except (OSError, ValueError, RuntimeError) as e:
        raise CorruptManifestError(f"cannot read the region snapshot file {uri}: {e}") from e


def to_lance_bytes(table: pa.Table) -> bytes:
    """``table`` as the bytes of a Lance file (for ``inline_snapshots``)."""
    with tempfile.TemporaryDirectory(prefix="memwal-snapshot-") as d:
        path = os.path.join(d, "snapshot.lance")
        write_lance_file(table, path)
        with open(path, "rb") as f:
            return f.read()


def from_lance_bytes(data: bytes) -> pa.Table:
    """Invert :func:`to_lance_bytes`."""
    with tempfile.TemporaryDirectory(prefix="memwal-snapshot-") as d:
        path = os.path.join(d, "snapshot.lance")
        with open(path, "wb") as f:
            f.write(data)
        return read_lance_file(path)


def load_region_snapshots(
    details: MemWalIndexDetails,
    spec: RegionSpec | None,
    store_uri_for: Callable[[str], str],
    storage_options: dict[str, str] | None = None,
) -> list[RegionManifest] | None:
    """The region manifests snapshotted in ``details``; None when there is no snapshot or it
    cannot be read (the file was cleaned up): readers then read the region manifests, which
    are authoritative anyway."""
    if details.snapshot_ts_millis <= 0:
        return None
    try:
        if details.HasField("inline_snapshots"):
            table = from_lance_bytes(details.inline_snapshots)
        else:
            table = read_lance_file(
                store_uri_for(external_snapshot_path(details.snapshot_ts_millis)), storage_options
            )
        return manifests_from_table(table, spec)
    except (MemWalError, KeyError, ValueError):
        return None
