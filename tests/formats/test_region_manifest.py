import threading
import uuid

import pytest

from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.errors import CommitConflictError, CorruptManifestError, RegionSealedError
from memwal_sql.formats.region_manifest import RegionManifestStore, claim_region
from memwal_sql.storage import ObjectStore, layout


@pytest.fixture
def manifests(tmp_path):
    return RegionManifestStore(ObjectStore(str(tmp_path)), str(uuid.uuid4()))


def test_first_claim_is_version_1_epoch_1_like_lance(manifests):
    m = claim_region(manifests, region_spec_id=1, field_entries=[("bucket", b"\x03\x00\x00\x00")])
    assert (m.version, m.writer_epoch, m.current_generation, m.region_spec_id) == (1, 1, 1, 1)
    assert uuid.UUID(bytes=m.region_id.uuid) == uuid.UUID(manifests.region_id)
    assert manifests.latest() == m
    assert manifests.store.get(layout.version_hint_path(manifests.region_id)) == b'{"version":1}'


def test_reclaim_bumps_epoch_and_copies_fields(manifests):
    claim_region(manifests, region_spec_id=1, field_entries=[("bucket", b"\x01\x00\x00\x00")])
    m2 = claim_region(manifests, region_spec_id=1)
    assert (m2.version, m2.writer_epoch) == (2, 2)
    assert m2.region_field_entries[0].value == b"\x01\x00\x00\x00"


def test_commit_of_an_existing_version_conflicts(manifests):
    m = claim_region(manifests, region_spec_id=0)
    with pytest.raises(CommitConflictError):
        manifests.commit(m)


def test_racing_claims_get_distinct_epochs(manifests):
    epochs = []

    def claim():
        epochs.append(claim_region(manifests, region_spec_id=0).writer_epoch)

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(epochs) == [1, 2, 3, 4, 5, 6]
    assert manifests.latest().version == 6


def test_latest_without_hint_and_after_old_versions_are_gone(manifests):
    for _ in range(5):
        claim_region(manifests, region_spec_id=0)
    store, rid = manifests.store, manifests.region_id
    store.delete(layout.version_hint_path(rid))
    for v in (1, 2, 3):
        store.delete(layout.manifest_path(rid, v))
    assert manifests.latest().version == 5
    # A stale hint pointing at a deleted version is survived as well.
    store.put(layout.version_hint_path(rid), b'{"version":2}')
    assert manifests.latest_version() == 5


def test_refresh_sees_past_versions_gc_collected(manifests):
    """A reader knows v2; v3..v5 are committed and GC keeps the newest two: v3 (the next of
    the known one) is gone, and the known one is not the newest (it was reused as such, and a
    long-lived reader missed every flush since)."""
    for _ in range(2):
        claim_region(manifests, region_spec_id=0)
    known = manifests.latest()
    assert manifests.refresh(known) is known
    for _ in range(3):
        claim_region(manifests, region_spec_id=0)
    store, rid = manifests.store, manifests.region_id
    for v in (1, 2, 3):
        store.delete(layout.manifest_path(rid, v))
    assert manifests.refresh(known).version == 5


def test_sealed_region_refuses_claims(manifests):
    m = claim_region(manifests, region_spec_id=0)
    sealed = RegionManifest()
    sealed.CopyFrom(m)
    sealed.version = 2
    sealed.status = 1
    manifests.commit(sealed)
    with pytest.raises(RegionSealedError):
        claim_region(manifests, region_spec_id=0)


def test_corrupt_manifest_is_a_typed_error(manifests):
    manifests.store.put(layout.manifest_path(manifests.region_id, 1), b"\xff\xff garbage")
    with pytest.raises(CorruptManifestError):
        manifests.read(1)
