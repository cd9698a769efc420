"""Region manifests: versioned, put-if-not-exists commits, and epoch-fenced claims.

A region manifest version ``v`` lives at ``_mem_wal/{region}/manifest/{bitrev64(v)}.binpb``.
Versions start at 1 and grow by one; a commit is a put-if-not-exists of the next version, so two
writers can never both commit the same version. ``version_hint.json`` (``{"version":N}``, as Lance
writes it) is only a hint: readers start from it and probe forward.

Example:
    >>> from memwal_sql.storage import ObjectStore
    >>> store = ObjectStore("memory://manifest-doc")
    >>> manifests = RegionManifestStore(store, "7d4f7a4e-0000-4000-8000-000000000001")
    >>> m = claim_region(manifests, region_spec_id=0)
    >>> (m.version, m.writer_epoch, m.current_generation)
    (1, 1, 1)
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

from google.protobuf.message import DecodeError

from memwal_sql._proto.memwal_pb2 import RegionFieldEntry, RegionManifest
from memwal_sql.errors import (
    CommitConflictError,
    CorruptManifestError,
    ObjectExistsError,
    ObjectNotFoundError,
    RegionSealedError,
    StorageError,
    StorageUnavailableError,
    SyncFailedError,
    WriterFencedError,
)
from memwal_sql.storage import ObjectStore, layout
from memwal_sql.storage.checksums import expect_checksums

__all__ = [
    "RegionManifest",
    "RegionManifestStore",
    "check_not_behind_index",
    "claim_region",
    "commit_change",
    "region_uuid_bytes",
]

SEALED = 1
_CLAIM_ATTEMPTS = 32
_COMMIT_ATTEMPTS = 4


def region_uuid_bytes(region_id: str) -> bytes:
    """The 16 RFC 4122 bytes stored in ``RegionManifest.region_id``."""
    return uuid.UUID(region_id).bytes


class RegionManifestStore:
    """Read and commit the manifest versions of one region."""

    def __init__(self, store: ObjectStore, region_id: str) -> None:
        self.store = store
        self.region_id = str(uuid.UUID(region_id))

    def read(self, version: int) -> RegionManifest:
        """Manifest ``version``; :class:`ObjectNotFoundError` if it does not exist."""
        data = self.store.get(layout.manifest_path(self.region_id, version))
        m = RegionManifest()
        try:
            m.ParseFromString(data)
        except DecodeError as e:
            raise CorruptManifestError(
                f"region {self.region_id} manifest v{version} is not a RegionManifest: {e}"
            ) from e
        if m.version != version:
            raise CorruptManifestError(
                f"region {self.region_id}: file of v{version} holds version {m.version}"
            )
        self._expect_checksums(m)
        return m

    def _expect_checksums(self, manifest: RegionManifest) -> None:
        """Tell the checksum module which generations must have their checksum record."""
        for g in manifest.flushed_generations:
            path = f"{layout.region_dir(self.region_id)}/{g.path}"
            crc = g.checksums_crc32c if g.HasField("checksums_crc32c") else None
            expect_checksums(self.store.uri_for(path), crc)

    def latest_version(self) -> int:
        """Newest committed version, 0 if the region has no manifest."""
        start = self._hinted_version()
        if start is None:
            # No usable hint: old versions may have been garbage-collected, so list instead of
            # probing from 1.
            versions = self.list_versions()
            start = versions[-1] if versions else 0
        elif start > 0 and not self.store.exists(layout.manifest_path(self.region_id, start)):
            versions = self.list_versions()
            if not versions or versions[-1] < start:
                # The hint is written after its version: a hint ahead of every version means
                # the newest versions were lost, and the one left would be read as current.
                raise CorruptManifestError(
                    f"region {self.region_id}: version_hint.json names manifest v{start}, but "
                    f"the newest manifest stored is "
                    f"{f'v{versions[-1]}' if versions else 'none'}: manifest versions were "
                    f"lost. Restore _mem_wal/{self.region_id}/manifest/ from a backup"
                )
            start = versions[-1]
        v = start
        while self.store.exists(layout.manifest_path(self.region_id, v + 1)):
            v += 1
        return v

    def latest(self) -> RegionManifest | None:
        """The newest manifest, or None for a region nobody has claimed yet."""
        v = self.latest_version()
        while v > 0:
            try:
                return self.read(v)
            except ObjectNotFoundError:  # raced with GC of old versions: look again
                v = self.latest_version()
        return None

    def refresh(self, known: RegionManifest | None) -> RegionManifest | None:
        """The newest manifest, reusing ``known`` when no newer version exists.

        Versions are consecutive, so ``known.version + 1`` missing proves ``known`` is still
        the newest, as long as ``known.version`` itself is still there: GC deletes the oldest
        versions first, so a missing next version beside a missing ``known`` means both were
        collected after newer ones were committed. Two existence checks instead of reading
        hint and manifest.
        """
        if (
            known is not None
            and not self.store.exists(layout.manifest_path(self.region_id, known.version + 1))
            and self.store.exists(layout.manifest_path(self.region_id, known.version))
        ):
            return known
        return self.latest()

    def list_versions(self) -> list[int]:
        """Every stored version, ascending."""
        out = []
        for meta in self.store.list(layout.manifest_dir(self.region_id) + "/"):
            if meta.path.endswith(layout.MANIFEST_SUFFIX):
                try:
                    out.append(layout.parse_bitrev64(meta.path))
                except ValueError:
                    continue
        return sorted(out)

    def commit(self, manifest: RegionManifest) -> None:
        """Write ``manifest`` as its version; :class:`CommitConflictError` if it exists."""
        data = manifest.SerializeToString()
        try:
            self.store.put_if_not_exists(
                layout.manifest_path(self.region_id, manifest.version), data
            )
        except ObjectExistsError as e:
            raise CommitConflictError(
                f"region {self.region_id} manifest v{manifest.version} was committed by "
                "another writer"
            ) from e
        try:
            self.store.put(
                layout.version_hint_path(self.region_id),
                json.dumps({"version": manifest.version}, separators=(",", ":")).encode(),
            )
        except Exception:
            pass

    def _hinted_version(self) -> int | None:
        try:
            hint = json.loads(self.store.get(layout.version_hint_path(self.region_id)))
            return int(hint["version"])
        except (ObjectNotFoundError, ValueError, KeyError, TypeError):
            return None


def check_not_behind_index(
    region_id: str, manifest: RegionManifest | None, merged_generation: int
) -> None:
    """Raise :class:`CorruptManifestError` if the MemWAL index has merged generations of the
    region that ``manifest`` (None: no manifest at all) does not know of."""
    if merged_generation <= 0:
        return
    if manifest is None:
        raise CorruptManifestError(
            f"region {region_id} is in the MemWAL index (merged up to generation "
            f"{merged_generation}) but its manifests are gone: its directory was removed or "
            f"lost. Restore _mem_wal/{region_id}/ from a backup; the region refuses writers "
            "until then, so that no new write reuses a merged generation number"
        )
    if manifest.current_generation <= merged_generation:
        raise CorruptManifestError(
            f"region {region_id}: manifest v{manifest.version} is at generation "
            f"{manifest.current_generation}, but the MemWAL index has merged generation "
            f"{merged_generation}: newer manifest versions were lost. Restore "
            f"_mem_wal/{region_id}/manifest/ from a backup"
        )


def claim_region(
    manifests: RegionManifestStore,
    *,
    region_spec_id: int,
    field_entries: list[tuple[str, bytes]] | None = None,
    merged_generation: int = 0,
) -> RegionManifest:
    """Claim a region for a new writer: commit the next version with the next writer epoch.

    A region without a manifest starts at version 1, epoch 1, generation 1 (as Lance 14 does).
    Otherwise every field is copied and ``writer_epoch`` goes up by one, which fences the previous
    writer at its next manifest commit. A lost race is retried on the new latest version.

    ``merged_generation`` is the region's merge progress in the MemWAL index: a region whose
    manifest is missing or older than that lost state, and a writer on it would reuse
    generation numbers that every reader skips as merged (:class:`CorruptManifestError`).
    """
    for _ in range(_CLAIM_ATTEMPTS):
        prev = manifests.latest()
        check_not_behind_index(manifests.region_id, prev, merged_generation)
        m = RegionManifest()
        if prev is None:
            m.version = 1
            m.writer_epoch = 1
            m.current_generation = 1
            m.region_spec_id = region_spec_id
            m.region_id.uuid = region_uuid_bytes(manifests.region_id)
            for field_id, value in field_entries or []:
                m.region_field_entries.append(RegionFieldEntry(field_id=field_id, value=value))
        else:
            if prev.status == SEALED:
                raise RegionSealedError(
                    f"region {manifests.region_id} is sealed and refuses writers; "
                    "write to another region"
                )
            m.CopyFrom(prev)
            m.version = prev.version + 1
            m.writer_epoch = prev.writer_epoch + 1
        try:
            manifests.commit(m)
            return m
        except CommitConflictError:
            continue
    raise CommitConflictError(
        f"could not claim region {manifests.region_id} after {_CLAIM_ATTEMPTS} attempts: "
        "other writers keep claiming it"
    )


def commit_change(
    manifests: RegionManifestStore,
    change: Callable[[RegionManifest], bool],
    *,
    max_epoch: int | None = None,
) -> RegionManifest | None:
    """Commit the next manifest version with ``change`` applied to a copy of the latest one.

    ``change`` returns False when there is nothing to do (for instance because an earlier
    attempt whose reply was lost already committed it); then nothing is written and None is
    returned. A lost race is retried on the new latest version. With ``max_epoch`` (a writer's
    own epoch), a newer writer epoch in the latest version raises :class:`WriterFencedError`.
    """
    transient = 0
    while True:
        latest = manifests.latest()
        if latest is None:
            raise CorruptManifestError(f"region {manifests.region_id} has no manifest")
        if max_epoch is not None and latest.writer_epoch > max_epoch:
            raise WriterFencedError(
                f"region {manifests.region_id} was claimed by writer epoch "
                f"{latest.writer_epoch} (this writer has {max_epoch}); acknowledged writes are "
                "safe in the WAL, reopen a writer to continue"
            )
        m = RegionManifest()
        m.CopyFrom(latest)
        m.version = latest.version + 1
        if not change(m):
            return None
        try:
            manifests.commit(m)
            return m
        except CommitConflictError:
            continue
        except SyncFailedError:
            raise  # a retry would find the manifest it could not make durable, and take it
        except StorageUnavailableError:
            raise  # the store already retried what it did not answer
        except StorageError:
            transient += 1
            if transient >= _COMMIT_ATTEMPTS:
                raise
            time.sleep(0.05 * 2**transient)
