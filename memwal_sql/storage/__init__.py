"""Storage: one object-store interface and the names of everything a MemWAL table stores."""

from memwal_sql.storage.store import ObjectMeta, ObjectStore, storage_error, storage_failures

__all__ = ["ObjectMeta", "ObjectStore", "storage_error", "storage_failures"]
