"""Storage: one object-store interface and the names of everything a MemWAL table stores."""

from memwal_sql.storage.store import ObjectMeta, ObjectStore

__all__ = ["ObjectMeta", "ObjectStore"]
