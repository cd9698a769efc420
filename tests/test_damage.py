"""Lost or damaged state is a typed error for every reader, writer and merge, never wrong or
missing rows (issue: reliability hardening)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import CorruptManifestError
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.maintenance.status import region_status
from memwal_sql.storage import layout

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])


def rows(ids, tag="v"):
    return pa.table({"id": ids, "v": [f"{tag}{i}" for i in ids]}, schema=SCHEMA)


def merged_table(root: Path) -> tuple[str, str]:
    """A table whose region the MemWAL index knows (generation 1 merged), with an unmerged
    generation 2 and a WAL tail. Returns (uri, region id)."""
    uri = str(root)
    tbl = mw.create_table(uri, SCHEMA, primary_key="id")
    with tbl.writer() as w:
        w.upsert(rows([1, 2, 3]))
        w.flush()
        rid = w.region_id
    tbl.merge()
    with tbl.writer() as w:
        w.upsert(rows([3, 4], "new"))
        w.flush()
        w.upsert(rows([5]))
    tbl.close()
    return uri, rid


def every_access(uri: str, rid: str):
    """Each way of reading, writing and merging the table, by name."""

    def sql():
        ctx = mw.connect()
        ctx.register("t", mw.open_table(uri))
        return ctx.sql("SELECT count(*) FROM t").to_arrow_table()

    return {
        "to_arrow": lambda: mw.open_table(uri).to_arrow(),
        "count_rows": lambda: mw.open_table(uri).count_rows(),
        "filtered": lambda: mw.open_table(uri).to_arrow(filter="id = 3"),
        "lookup": lambda: mw.open_table(uri).lookup([3]),
        "sql": sql,
        "writer": lambda: mw.open_table(uri).writer(region_id=rid),
        "merge": lambda: mw.open_table(uri).merge(),
    }


def verify_finds(uri: str, kind: str, error: str) -> None:
    """``memwal verify`` (the CLI, exit status 1) and ``tbl.verify()`` report the damage."""
    from memwal_sql.cli import main

    report = mw.open_table(uri).verify()
    assert not report.ok
    assert any(p.kind == kind and p.error == error for p in report.problems), report.summary()
    with pytest.raises(SystemExit) as exit_:
        main(["verify", uri])
    assert exit_.value.code == 1


def test_verify_finds_nothing_wrong_with_a_healthy_table(tmp_path, capsys):
    from memwal_sql.cli import main

    uri, _ = merged_table(tmp_path)
    report = mw.open_table(uri).verify()
    assert report.ok and report.generations >= 2 and report.unverifiable_generations == 0
    assert report.wal_entries > 0 and report.manifest_versions > 0
    main(["verify", uri])
    assert "no damage found" in capsys.readouterr().out


def test_a_removed_region_directory_fails_reads_writes_and_merges(tmp_path):
    uri, rid = merged_table(tmp_path)
    region_dir = tmp_path / layout.region_dir(rid)
    shutil.rmtree(region_dir)
    for name, access in every_access(uri, rid).items():
        with pytest.raises(CorruptManifestError, match="manifests are gone"):
            access()
        assert not region_dir.exists(), f"{name} wrote into the lost region"
    [status] = region_status(mw.open_table(uri))
    assert status.region_id == rid and "manifests are gone" in status.problem
    verify_finds(uri, "manifest", "CorruptManifestError")


def test_a_removed_newest_manifest_version_fails_reads_writes_and_merges(tmp_path):
    uri, rid = merged_table(tmp_path)
    store = mw.open_table(uri).store
    store.delete(layout.manifest_path(rid, RegionManifestStore(store, rid).list_versions()[-1]))
    before = sorted(m.path for m in store.list(layout.region_dir(rid) + "/"))
    for _name, access in every_access(uri, rid).items():
        with pytest.raises(CorruptManifestError, match="manifest"):
            access()
    assert sorted(m.path for m in store.list(layout.region_dir(rid) + "/")) == before
    [status] = region_status(mw.open_table(uri))
    assert "lost" in status.problem
    verify_finds(uri, "manifest", "CorruptManifestError")


def test_a_manifest_behind_the_index_refuses_a_writer(tmp_path):
    # The hint is gone too, so only the MemWAL index can tell: the manifest left is at a
    # generation the index has merged.
    uri, rid = merged_table(tmp_path)
    store = mw.open_table(uri).store
    manifests = RegionManifestStore(store, rid)
    versions = manifests.list_versions()
    merged = mw.open_table(uri).merged_generations()[rid]
    keep = max(v for v in versions if manifests.read(v).current_generation <= merged)
    for v in versions:
        if v > keep:
            store.delete(layout.manifest_path(rid, v))
    store.delete(layout.version_hint_path(rid))
    for name in ("to_arrow", "writer", "merge"):
        with pytest.raises(CorruptManifestError, match="newer manifest versions were lost"):
            every_access(uri, rid)[name]()
    verify_finds(uri, "manifest", "CorruptManifestError")


def unmerged_generation_dir(uri: str, rid: str) -> Path:
    tbl = mw.open_table(uri)
    [(_, manifest)] = [(r, m) for r, m in tbl.region_manifests() if r == rid]
    merged = tbl.merged_generations()[rid]
    gen = min(
        (g for g in manifest.flushed_generations if g.generation > merged),
        key=lambda g: g.generation,
    )  # the one holding ids 3 and 4
    return Path(uri) / layout.region_dir(rid) / gen.path


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def data_file(gen_dir: Path) -> Path:
    [f] = list((gen_dir / "data").glob("*.lance"))
    return f


DAMAGE = {
    "removed data file": lambda g: data_file(g).unlink(),
    "zero-byte _pk_index": lambda g: (g / "_pk_index" / "page_data.lance").write_bytes(b""),
    "flipped bit in data": lambda g: flip_bit(data_file(g), 40),
    "flipped bit in bloom filter": lambda g: flip_bit(g / "bloom_filter.bin", 7),
}

# The accesses that do not open the damaged file, and so neither read nor verify it: scans read
# a generation's rows only, and a lookup of many keys asks its key index, not its bloom filter.
NOT_OPENED = {
    "flipped bit in bloom filter": {"to_arrow", "count_rows", "sql", "lookup many"},
    "zero-byte _pk_index": {"to_arrow", "count_rows", "sql"},
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_generation_file_fails_reads_lookups_and_merges(tmp_path, damage):
    from memwal_sql.errors import CorruptGenerationError

    uri, rid = merged_table(tmp_path)
    base_before = mw.open_table(uri).dataset().to_table().sort_by("id")
    DAMAGE[damage](unmerged_generation_dir(uri, rid))
    accesses = every_access(uri, rid)
    accesses["lookup many"] = lambda: mw.open_table(uri).lookup(list(range(200)))
    for name, access in accesses.items():
        if name == "writer":
            continue  # a writer reads no generation; it may go on writing
        if name in NOT_OPENED.get(damage, ()):
            access()
            continue
        with pytest.raises(CorruptGenerationError, match="damaged"):
            access()
    assert mw.open_table(uri).dataset().to_table().sort_by("id").equals(base_before)
    verify_finds(uri, "generation", "CorruptGenerationError")


def lance_flushed_table(root: Path) -> tuple[str, Path]:
    """A table with a generation Lance's own writer flushed (no checksum record, no
    checksums in the manifest), and that generation's directory."""
    import lance

    uri = str(root)
    tbl = mw.create_table(uri, SCHEMA, primary_key="id")
    with lance.dataset(uri).mem_wal_writer(mw.DEFAULT_REGION_ID) as w:
        w.put(rows(list(range(20))))
    manifest = RegionManifestStore(tbl.store, mw.DEFAULT_REGION_ID).latest()
    assert manifest is not None
    [gen] = manifest.flushed_generations
    assert not gen.HasField("checksums_crc32c")
    return uri, root / layout.region_dir(mw.DEFAULT_REGION_ID) / gen.path


def test_a_generation_lance_flushed_is_read_unverified(tmp_path):
    uri, _ = lance_flushed_table(tmp_path)
    assert mw.open_table(uri).count_rows() == 20
    report = mw.open_table(uri).verify()
    assert report.ok and report.unverifiable_generations == 1


def test_a_zero_byte_pk_index_without_checksums_is_a_typed_error_not_a_panic(tmp_path):
    # A generation Lance's own writer flushed: no checksum record to check against.
    from memwal_sql.errors import CorruptGenerationError

    uri, gen_dir = lance_flushed_table(tmp_path)
    (gen_dir / "_pk_index" / "page_data.lance").write_bytes(b"")
    with pytest.raises(CorruptGenerationError, match="panicked"):
        mw.open_table(uri).lookup(list(range(200)))


def drop_record(gen_dir: Path) -> None:
    from memwal_sql.storage.checksums import CHECKSUMS

    (gen_dir / CHECKSUMS).unlink()


def drop_data_entry(gen_dir: Path) -> None:
    import json

    from memwal_sql.storage.checksums import CHECKSUMS

    record = json.loads((gen_dir / CHECKSUMS).read_bytes())
    name = str(data_file(gen_dir).relative_to(gen_dir))
    del record["files"][name]
    (gen_dir / CHECKSUMS).write_text(json.dumps(record, sort_keys=True))


@pytest.mark.parametrize("lose", [drop_record, drop_data_entry], ids=["record", "entry"])
def test_losing_the_checksum_record_cannot_hide_a_flipped_bit(tmp_path, lose):
    """The record gone (or its entry of the data file), a bit flipped at any of 24 offsets of
    the data file: every read, lookup and merge fails typed, and verify reports it."""
    from memwal_sql.errors import CorruptGenerationError

    uri, rid = merged_table(tmp_path / "pristine")
    size = data_file(unmerged_generation_dir(uri, rid)).stat().st_size
    for i, offset in enumerate(range(0, size, max(1, size // 24))[:24]):
        copy = tmp_path / f"at{offset}"
        shutil.copytree(uri, copy)
        gen_dir = unmerged_generation_dir(str(copy), rid)
        lose(gen_dir)
        flip_bit(data_file(gen_dir), offset)
        base_before = mw.open_table(str(copy)).dataset().to_table().sort_by("id")
        for name, access in every_access(str(copy), rid).items():
            if name == "writer":
                continue  # a writer reads no generation
            with pytest.raises(CorruptGenerationError, match=r"_memwal_checksums\.json"):
                access()
        assert mw.open_table(str(copy)).dataset().to_table().sort_by("id").equals(base_before)
        if i % 8 == 0:  # verify (and its CLI) on a third of them: each takes a while
            verify_finds(str(copy), "generation", "CorruptGenerationError")


def test_verify_finds_a_damaged_and_a_missing_wal_entry(tmp_path):
    uri, rid = merged_table(tmp_path)
    tbl = mw.open_table(uri)
    with tbl.writer(region_id=rid) as w:
        for i in range(3):
            w.upsert(rows([100 + i]))
        first = w.stats()["next_wal_position"] - 3
        w.release()  # the rows stay in the WAL only
    wal = tmp_path / layout.wal_dir(rid)
    flip_bit(wal / Path(layout.wal_entry_path(rid, first)).name, 60)
    verify_finds(uri, "wal", "CorruptWalEntryError")
    (wal / Path(layout.wal_entry_path(rid, first + 1)).name).unlink()
    verify_finds(uri, "wal", "MissingWalEntryError")


def test_a_removed_generation_directory_fails_merges_and_reads(tmp_path):
    from memwal_sql.errors import CorruptGenerationError

    uri, rid = merged_table(tmp_path)
    shutil.rmtree(unmerged_generation_dir(uri, rid))
    for name in ("merge", "to_arrow", "lookup"):
        with pytest.raises(CorruptGenerationError, match="missing"):
            every_access(uri, rid)[name]()
    verify_finds(uri, "generation", "CorruptGenerationError")


@pytest.mark.parametrize("key_type", [pa.int64(), pa.uint64(), pa.int32()])
def test_out_of_range_keys_are_typed_errors_and_write_nothing(tmp_path, key_type):
    from memwal_sql.errors import SchemaMismatchError

    schema = pa.schema([pa.field("id", key_type, False), pa.field("v", pa.string())])
    tbl = mw.create_table(str(tmp_path), schema, primary_key="id")
    tbl.upsert({"id": [1], "v": ["a"]})
    too_big = 2**64 if key_type != pa.int32() else 2**40
    for call in (
        lambda: tbl.upsert({"id": [too_big], "v": ["b"]}),
        lambda: tbl.writer().upsert({"id": [too_big], "v": ["b"]}),
        lambda: tbl.delete([too_big]),
        lambda: tbl.lookup([too_big]),
    ):
        with pytest.raises(SchemaMismatchError):
            call()
    assert tbl.to_arrow().to_pydict() == {"id": [1], "v": ["a"]}
    tbl.close()


EVENTUAL_SWEEP = """
import shutil, sys
from pathlib import Path
import memwal_sql as mw
from memwal_sql.errors import CorruptGenerationError
from tests.test_damage import data_file, drop_record, flip_bit
pristine, rid, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
# Found by name: reading a region manifest here would tell this process of the record.
[gen] = Path(pristine, "_mem_wal", rid).glob("*_gen_1")
size = data_file(gen).stat().st_size
for offset in range(0, size, max(1, size // 24))[:24]:
    copy = work / f"at{offset}"
    shutil.copytree(pristine, copy)
    gen_dir = copy / "_mem_wal" / rid / gen.name
    drop_record(gen_dir)
    flip_bit(data_file(gen_dir), offset)
    tbl = mw.open_table(str(copy))
    for consistency in ("eventual", "strong"):  # the eventual read first: nothing known yet
        try:
            tbl.to_arrow(consistency=consistency)
            print("read", offset, consistency)
        except CorruptGenerationError as e:
            print("refused" if "_memwal_checksums.json" in str(e) else f"other:{e}")
"""


def test_an_eventual_read_in_a_fresh_process_also_needs_the_record(tmp_path):
    """An eventual read takes its regions from the MemWAL index's region snapshot, which
    carries no checksums: it must still learn from the region manifest that the generation
    has a record, in a process that has read no manifest yet (and not let a strong read after
    it skip the check)."""
    import subprocess
    import sys

    uri = str(tmp_path / "pristine")
    tbl = mw.create_table(uri, SCHEMA, primary_key="id")
    with tbl.writer() as w:  # a generation of 100 rows: most flipped bits still decode
        w.upsert(rows(list(range(100))))
        rid = w.region_id
    tbl.build_region_snapshots()
    out = subprocess.run(
        [sys.executable, "-c", EVENTUAL_SWEEP, uri, rid, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=300,
        check=True,
    ).stdout.split("\n")
    assert [line for line in out if line] == ["refused"] * 48


def test_the_one_region_per_key_check_opens_only_the_generations_rows(tmp_path):
    """A scan of a table whose regions are split by a non-key column checks that no key is in
    two regions, reading each generation's keys: it verifies the files it opens (the rows), so
    damage to a file it never opens (the bloom filter) is for the reads that open that."""
    from memwal_sql.errors import CorruptGenerationError

    uri = str(tmp_path / "t")
    schema = pa.schema([pa.field("id", pa.int64(), False), ("tenant", pa.string())])
    tbl = mw.create_table(uri, schema, primary_key="id", allow_non_key_region_spec=True,
                          region_spec=mw.RegionSpec.identity("tenant"))  # fmt: skip
    tbl.upsert({"id": [1, 2, 3], "tenant": ["a", "a", "b"]})
    tbl.close()
    fresh = mw.open_table(uri)
    rid, manifest = next((r, m) for r, m in fresh.region_manifests() if m.flushed_generations)
    gen_dir = Path(uri) / layout.region_dir(rid) / manifest.flushed_generations[0].path
    flip_bit(gen_dir / "bloom_filter.bin", 7)
    assert sorted(fresh.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    with pytest.raises(CorruptGenerationError, match="damaged"):
        mw.open_table(uri).lookup([1])  # a lookup opens the bloom filter
