"""The one exception hierarchy of memwal-sql.

Every error raised on purpose by this package derives from :class:`MemWalError`. Errors a caller
may retry (a lost race on a put-if-not-exists) derive from :class:`RetryableError`; everything
else is fatal for the operation that raised it. Each message says what to do next.

Example:
    >>> from memwal_sql import errors
    >>> issubclass(errors.WriterFencedError, errors.MemWalError)
    True
"""

from __future__ import annotations


class MemWalError(Exception):
    """Base class of every memwal-sql error."""


class RetryableError(MemWalError):
    """The operation lost a race and may succeed if retried on fresh state."""


class CommitConflictError(RetryableError):
    """Another writer committed the same manifest version or WAL position first."""


class NamespaceConflictError(CommitConflictError):
    """A namespace batch commit lost a race: another batch committed ``__manifest`` first
    more often than the retries allow, or a table it versions moved on since its version was
    staged. Stage the versions again on the tables' new state and commit the batch again."""


class GenerationCollectedError(RetryableError):
    """A read's snapshot named a generation that was merged and garbage-collected since;
    a new read (a new snapshot) reads its rows from the base table."""


class SnapshotExpiredError(MemWalError):
    """A pinned snapshot (or a change feed's start) needs files that garbage collection
    removed: it is older than the retention (``base_versions_older_than``) and not tagged."""


class InvalidInputError(MemWalError, ValueError):
    """The data handed to a writer or table is not acceptable; nothing was written."""


class InvalidSnapshotError(InvalidInputError):
    """A snapshot token that does not parse, belongs to another table, or a tag that does not
    exist (or exists already)."""


class InvalidBatchError(InvalidInputError):
    """A namespace batch (``batch_commit_tables``) that can never apply as given: an operation
    with no or two kinds, a branch, a staged manifest that is missing or outside its table,
    deleting the version readers open; nothing was committed. The message says which."""


class SchemaMismatchError(InvalidInputError):
    """Columns are missing, unknown, or of a type that cannot be cast to the table schema."""


class PrimaryKeyError(InvalidInputError):
    """A primary-key column is missing or holds nulls."""


class DuplicateKeyError(PrimaryKeyError):
    """An existing Lance table holds a primary key more than once, so MemWAL cannot be
    enabled on it until the duplicates are removed."""


class KeyRegionChangeError(PrimaryKeyError):
    """A write would give a key versions in two regions: its region columns changed while
    its previous region still holds an unmerged version of it (merge that region first)."""


class WrongRegionError(InvalidInputError):
    """Rows were handed to a region writer whose region does not own them."""


class InvalidFilterError(InvalidInputError):
    """A ``filter=`` string is not one boolean SQL expression over the table's columns."""


class StatementNotAllowedError(InvalidInputError):
    """A SQL statement that a session of ``mw.connect()`` refuses: DDL (``CREATE``,
    ``DROP``, ``CREATE EXTERNAL TABLE``), ``COPY``, ``SET`` and any other that reads or
    writes a path or changes the session (``mw.connect(trusted=True)`` allows them); DML
    but ``INSERT``, ``UPDATE`` and ``DELETE`` of a MemWAL table; any DML in a read-only
    session."""


class SqlError(MemWalError, ValueError):
    """A SQL statement does not parse or plan (a syntax error, an unknown table, column or
    function). ``line`` and ``column`` (1-based) point into ``statement`` where DataFusion
    says, or at the name it could not resolve; ``None`` when neither is known."""

    def __init__(
        self,
        message: str,
        *,
        statement: str = "",
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        super().__init__(message)
        self.statement, self.line, self.column = statement, line, column


class InvalidRegionSpecError(InvalidInputError):
    """A region spec is malformed or does not fit the table schema."""


class WriterError(MemWalError):
    """A region writer can no longer accept writes."""


class WriterFencedError(WriterError):
    """A newer writer claimed the region (a higher epoch); this writer must stop."""


class WriterClosedError(WriterError):
    """The region writer was closed; open a new one with ``table.writer(...)``."""


class TableClosedError(WriterClosedError):
    """The table was closed (``tbl.close()``); open it again with ``mw.open_table(uri)``."""


class RegionSealedError(WriterError):
    """The region is sealed and refuses new writer claims."""


class StorageError(MemWalError):
    """The object store failed or holds something it should not."""


class StorageUnavailableError(StorageError):
    """The object store did not answer: a connection failed or a request timed out after the
    retries ``storage_options`` allow (``timeout``, ``client_max_retries``,
    ``client_retry_timeout``). Nothing above the store retries it again; check that the
    endpoint is up and reachable, then run the operation again."""


class AuthenticationError(StorageError):
    """The object store refused the credentials; the message says which call."""


class SyncFailedError(StorageError):
    """An fsync failed: the file system may have dropped written data, so the put is not
    retried (a retried fsync can succeed without the data being on disk)."""


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """An object the format requires is missing."""


class ObjectExistsError(StorageError, FileExistsError):
    """A put-if-not-exists found the object already there."""


class CorruptWalEntryError(StorageError):
    """A WAL entry cannot be decoded (truncated or not an Arrow IPC stream)."""


class MissingWalEntryError(CorruptWalEntryError):
    """A WAL position is missing while later positions exist: an entry was lost."""


class TornWalEntryWarning(UserWarning):
    """The last WAL entry of a region is torn by a crash of the machine during its put; it was
    never acknowledged, so reads leave it out and the next writer moves it aside."""


class CorruptManifestError(StorageError):
    """A region manifest or MemWAL index entry cannot be decoded, or manifests were lost."""


class CorruptTableError(StorageError):
    """The table breaks an invariant of the format that no single file shows: a key with
    versions in two regions, or a primary key held twice by the base table."""


class KeyInTwoRegionsError(CorruptTableError):
    """A key has unmerged versions in two regions, so no read can tell which is newer and a
    merge would let whichever region merges last win (the spec's data-corruption case)."""


class CorruptGenerationError(StorageError):
    """A flushed generation's file is missing or does not match the checksum recorded when
    it was flushed; nothing was read from it or merged."""


class IndexCatchupError(MemWalError):
    """A base-table index cannot be brought over some merged rows (a vector no index can
    place, written before vectors were checked at write, or by another writer); the message
    names the rows. The other indexes and maintenance steps go on, and the index catches up
    on the first pass after the rows are fixed."""


class TableNotFoundError(MemWalError, FileNotFoundError):
    """No table at the uri, or it has no MemWAL index; create it with ``mw.create_table``."""


class TableExistsError(MemWalError, FileExistsError):
    """A table already exists at the uri; open it with ``mw.open_table``."""


class UnknownRegionError(MemWalError, KeyError):
    """No region with that id exists in the table."""
