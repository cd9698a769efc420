import os

import pyarrow as pa

import memwal_sql as mw
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.storage import layout
from memwal_sql.storage import store as store_module

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])


def test_every_file_of_a_generation_is_fsynced_before_the_manifest_names_it(tmp_path, monkeypatch):
    # Lance writes a generation without fsync; once the manifest commit names it, GC may delete
    # the WAL entries its rows came from, so a power loss must not be able to lose its files.
    synced: list[str] = []
    original = store_module._fsync_path
    monkeypatch.setattr(
        store_module, "_fsync_path", lambda p: (synced.append(os.path.realpath(p)), original(p))[1]
    )
    commit = RegionManifestStore.commit
    monkeypatch.setattr(
        RegionManifestStore,
        "commit",
        lambda self, m: (synced.append(f"commit {len(m.flushed_generations)}"), commit(self, m))[1],
    )
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    with tbl.writer() as w:
        w.upsert(pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=SCHEMA))
        w.flush()
        [gen] = tbl.region_manifests()[0][1].flushed_generations
    region = os.path.realpath(tmp_path / layout.region_dir(w.region_id))
    gen_dir = os.path.join(region, gen.path)
    files = [os.path.join(d, f) for d, _, fs in os.walk(gen_dir) for f in fs]
    dirs = [d for d, _, _ in os.walk(gen_dir)]
    assert any(f.endswith(".lance") for f in files) and any("_pk_index" in f for f in files)
    named = synced.index("commit 1")  # the commit that names the generation
    assert set(files + dirs + [region]) <= set(synced[:named])
    # Each directory after everything in it, so no name is synced before what it names.
    for f in files:
        assert synced.index(f) < synced.index(os.path.dirname(f))
