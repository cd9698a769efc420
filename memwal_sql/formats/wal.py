"""WAL entries: Arrow IPC streams at 1-based positions, as Lance 14 writes them.

An entry is one Arrow IPC *stream* holding one or more record batches of the WAL schema (the base
columns, non-key columns nullable, then ``_tombstone: bool not null``), with schema metadata
``writer_epoch`` (required) and ``generation`` (the MemTable generation it belongs to). A fence
sentinel is an entry with an empty schema, no batches and metadata ``fence_sentinel: "true"``; a
new writer puts it at the tail so that the stale writer's next put collides with it.

memwal-sql adds ``memwal_crc32c`` as the first schema metadata key (sentinels too): the CRC32C
of the entry's position (8 bytes, little-endian) followed by the whole entry with those eight hex
digits written as zeros. It is checked on the raw bytes before anything is parsed, so a changed
bit anywhere (a column's name or type, the epoch, a value) is a :class:`CorruptWalEntryError`
rather than a different row replayed; so is a whole entry found at another position than it was
written for (after a power loss, a file system without a journal can show a file's name over
blocks of an older, deleted file). Lance ignores the key; entries without it (Lance's) are read
unchecked, and those of memwal-sql before the position was included are checked without it.

A damaged entry is a :class:`CorruptWalEntryError`, with one exception: the *last* entry of a
WAL, on local disk, last written before the machine started. Its put was cut short by the
machine's crash (a put of an entry makes its name and data durable in one flush, see
:mod:`memwal_sql.storage.store`), so it was never acknowledged: :func:`iter_wal` ends before it
and a claiming writer moves it aside (:func:`set_aside_torn_entry`). "Last" allows fence
sentinels after it past the manifest's ``last_seen``, which is what a claim that the crash cut
short leaves (:func:`only_sentinels_after`, docs/durability.md).

Example:
    >>> import pyarrow as pa
    >>> b = pa.record_batch({"id": [1], "_tombstone": [False]})
    >>> data = encode_wal_entry([b], b.schema, writer_epoch=3, generation=1, position=7)
    >>> e = decode_wal_entry(data, 7)
    >>> (e.position, e.writer_epoch, e.generation, e.num_rows)
    (7, 3, 1, 1)
"""

from __future__ import annotations

import re
import struct
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import google_crc32c
import pyarrow as pa

from memwal_sql.errors import (
    CommitConflictError,
    CorruptWalEntryError,
    InvalidInputError,
    MissingWalEntryError,
    ObjectExistsError,
    ObjectNotFoundError,
    StorageError,
    TornWalEntryWarning,
)
from memwal_sql.storage import ObjectStore, layout

TOMBSTONE = "_tombstone"
_EPOCH = b"writer_epoch"
_GENERATION = b"generation"
_SENTINEL = b"fence_sentinel"
_CHECKSUM = b"memwal_crc32c"
_ZEROS = b"00000000"
# As flatbuffers stores strings: little-endian length, bytes, NUL.
_CHECKSUM_STRING = struct.pack("<I", len(_CHECKSUM)) + _CHECKSUM + b"\0"
_DIGITS_STRING = re.compile(rb"\x08\x00\x00\x00([0-9a-f]{8})\x00")
RECOVERY_LOOKS = 3
"""How many times a reader or writer looks at a WAL position that changes under it, as it does
only while another writer recovers a torn tail there, before it reports what it sees."""
_SET_ASIDE = (
    "; or, if it is the last entry of its region, give up its rows with "
    "`memwal set-aside TABLE_URI REGION_ID POSITION`"
)
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def wal_schema(base: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The WAL and generation schema: non-key columns nullable (tombstones leave them null),
    then ``_tombstone``."""
    fields = [
        f if f.name in primary_key else f.with_nullable(True) for f in base if f.name != TOMBSTONE
    ]
    return pa.schema([*fields, pa.field(TOMBSTONE, pa.bool_(), nullable=False)])


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A replayed batch in the table's WAL schema (Lance entries may lack ``_tombstone`` or
    carry other field metadata)."""
    if batch.schema.equals(schema):
        return batch
    cols = []
    for f in schema:
        idx = batch.schema.get_field_index(f.name)
        if idx >= 0:
            cols.append(batch.column(idx).cast(f.type))
        elif f.name == TOMBSTONE:
            cols.append(pa.array([False] * batch.num_rows, pa.bool_()))
        else:
            cols.append(pa.nulls(batch.num_rows, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


@dataclass(frozen=True)
class WalEntry:
    """One decoded WAL entry."""

    position: int
    writer_epoch: int
    generation: int | None
    is_sentinel: bool
    batches: tuple[pa.RecordBatch, ...]
    checksummed: bool = False
    """Written by memwal-sql (it carries a checksum), whose writers fsync every entry they put."""

    @property
    def num_rows(self) -> int:
        return sum(b.num_rows for b in self.batches)


def encode_wal_entry(
    batches: Sequence[pa.RecordBatch],
    schema: pa.Schema,
    *,
    writer_epoch: int,
    generation: int,
    position: int,
) -> bytes:
    """Serialize batches as the WAL entry at ``position`` (an Arrow IPC stream with its
    checksum)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        for b in batches:
            w.write_batch(b)
    stream = sink.getvalue()
    body = stream.slice(_schema_message_length(stream))
    template = _header_template(schema, _entry_metadata(writer_epoch, generation))
    return _checksummed(template, [body], position)


def _entry_metadata(writer_epoch: int, generation: int) -> dict[bytes, bytes]:
    return {_EPOCH: str(writer_epoch).encode(), _GENERATION: str(generation).encode()}


def _header_template(schema: pa.Schema, metadata: dict[bytes, bytes]) -> tuple[bytes, int]:
    """The schema message of ``schema`` with the checksum key (zeros) then ``metadata``, and
    where the checksum's eight digits are in it: the one place where two messages with
    different digits differ."""
    zeros, fs = (
        schema.with_metadata({_CHECKSUM: digits, **metadata}).serialize().to_pybytes()
        for digits in (_ZEROS, b"ffffffff")
    )
    at = next(i for i in range(len(zeros)) if zeros[i] != fs[i])
    assert len(zeros) == len(fs) and zeros[at + 8 :] == fs[at + 8 :]
    return zeros, at


def _checksummed(
    template: tuple[bytes, int], body: Sequence[pa.Buffer | bytes], position: int
) -> bytes:
    """The entry at ``position`` of schema message ``template`` and the messages ``body`` (in
    parts, not joined first), its checksum written in."""
    return b"".join(_checksummed_parts(template, body, position))


def _checksummed_parts(
    template: tuple[bytes, int], body: Sequence[pa.Buffer | bytes], position: int
) -> list[bytes | memoryview]:
    """:func:`_checksummed` as parts: the schema message with the checksum, then ``body``."""
    header, at = template
    crc = google_crc32c.extend(google_crc32c.value(_position_bytes(position)), header)
    for part in body:
        crc = google_crc32c.extend(crc, part)
    first = header[:at] + b"%08x" % crc + header[at + 8 :]
    return [first, *(p if isinstance(p, bytes) else memoryview(p) for p in body)]


def _position_bytes(position: int) -> bytes:
    return position.to_bytes(8, "little")


def _schema_message_length(stream: pa.Buffer) -> int:
    # A message: the continuation marker, the metadata's length, then the metadata (a schema
    # message has no body).
    marker, length = struct.unpack_from("<Ii", stream)
    return 8 + length if marker == 0xFFFFFFFF else 4 + marker


def _check_checksum(data: bytes | memoryview, position: int) -> None:
    """Raise :class:`CorruptWalEntryError` unless the entry's checksum holds, if it has one."""
    buf = pa.py_buffer(data)
    n = _schema_message_length(buf)
    if not 8 <= n <= len(buf) - len(_END_OF_STREAM):
        return  # not ours or not whole: the parse reports it
    header = buf.slice(0, n).to_pybytes()
    if _CHECKSUM_STRING not in header:
        return  # Lance's, or an older memwal-sql's
    if _checked_header(header, buf.slice(n), position) is None:
        raise CorruptWalEntryError(
            f"WAL entry at position {position} fails its checksum: its bytes changed after it "
            "was written, or it was written for another position. Restore it from a backup"
            + _SET_ASIDE
        )


def _checked_header(header: bytes, body: pa.Buffer, position: int) -> bytes | None:
    """The schema message ``header`` with its checksum's digits zeroed, if the checksum holds
    for it, the rest of the entry (``body``) and ``position``; None if it does not.

    The checksum is found in the raw schema message, before pyarrow parses anything: the key
    as flatbuffers stores a string, then the 8-digit string values whose zeroing gives it back.
    """
    at_position = google_crc32c.value(_position_bytes(position))
    for m in _DIGITS_STRING.finditer(header):
        zeroed = header[: m.start(1)] + _ZEROS + header[m.end(1) :]
        if b"%08x" % google_crc32c.extend(
            google_crc32c.extend(at_position, zeroed), body
        ) == m.group(1):
            return zeroed
        # Entries of memwal-sql before the checksum included the position.
        if b"%08x" % google_crc32c.extend(google_crc32c.value(zeroed), body) == m.group(1):
            return zeroed
    return None


class WalEntryEncoder:
    """:func:`encode_wal_entry` for a stream of entries of one schema, at a fraction of the cost
    and without a copy of a large entry.

    An IPC stream is its schema message, one message per batch, then the end-of-stream marker.
    A small batch is serialized on its own, with no stream writer. A large one (over
    ``COPY_BELOW`` bytes) is not copied at all: pyarrow's stream writer hands its messages to a
    sink in parts, the column buffers as views of the batch's own memory, and the entry is
    those parts (:meth:`parts`), which the store writes one after another. The checksum is
    taken over the parts without joining them. The schema message differs between entries of
    a generation only in the checksum's eight hex digits, so it is encoded once per generation
    and the digits are written into a copy. The bytes are identical to :func:`encode_wal_entry`
    (a test checks it). Schemas with dictionary columns need dictionary messages first and
    write all of an entry's batches through one stream writer.

    Example:
        >>> b = pa.record_batch({"id": [1], "_tombstone": [False]})
        >>> enc = WalEntryEncoder(b.schema, writer_epoch=2)
        >>> bytes(enc.encode([b], 1, 5)) == bytes(encode_wal_entry(
        ...     [b], b.schema, writer_epoch=2, generation=1, position=5))
        True
    """

    COPY_BELOW = 1 << 20
    """Batches up to this many bytes are serialized into one buffer (a copy): one C call
    instead of a stream writer's dozen Python ones, for the small entries of a write stream."""

    def __init__(self, schema: pa.Schema, *, writer_epoch: int) -> None:
        self.schema = schema
        self.writer_epoch = writer_epoch
        self._fast = not any(_has_dictionary(f.type) for f in schema)
        self._template: tuple[int, tuple[bytes, int]] | None = None  # per generation
        self._schema_length = len(schema.serialize())

    def encode(self, batches: Sequence[pa.RecordBatch], generation: int, position: int) -> bytes:
        """The WAL entry at ``position`` holding ``batches`` of MemTable ``generation``."""
        return b"".join(self.parts(batches, generation, position))

    def parts(
        self, batches: Sequence[pa.RecordBatch], generation: int, position: int
    ) -> list[bytes | memoryview]:
        """:meth:`encode` as parts whose concatenation is the entry: the memory of large
        batches is viewed, not copied, so the parts stay valid while ``batches`` do."""
        if self._template is None or self._template[0] != generation:
            metadata = _entry_metadata(self.writer_epoch, generation)
            self._template = (generation, _header_template(self.schema, metadata))
        body: list[pa.Buffer | bytes | memoryview] = []
        if not self._fast:
            body.extend(self._messages(batches))
        else:
            for b in batches:
                if b.nbytes <= self.COPY_BELOW:
                    body.append(b.serialize())
                else:
                    body.extend(self._messages([b]))
        body.append(_END_OF_STREAM)
        return _checksummed_parts(self._template[1], body, position)

    def _messages(self, batches: Sequence[pa.RecordBatch]) -> list[pa.Buffer | bytes]:
        """The IPC messages of ``batches`` (dictionaries first, as a stream writer orders
        them), in the parts the writer produces, without the schema message."""
        sink = _PartsSink()
        writer = pa.ipc.new_stream(sink, self.schema)
        for b in batches:
            writer.write_batch(b)
        # Not closed: that only appends the end-of-stream marker, which the entry adds itself.
        return sink.after(self._schema_length)


class _PartsSink:
    """A write-only file for pyarrow's IPC stream writer that keeps what it is given as it is
    given: the buffers of a batch's columns arrive as views of the batch's memory."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[pa.Buffer | bytes] = []

    def write(self, data: pa.Buffer | bytes) -> int:
        self.parts.append(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def after(self, skip: int) -> list[pa.Buffer | bytes]:
        """The parts written after the first ``skip`` bytes (the schema message)."""
        for i, part in enumerate(self.parts):
            if skip < len(part):
                return [part[skip:], *self.parts[i + 1 :]] if skip else self.parts[i:]
            skip -= len(part)
        return []


def _has_dictionary(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return True
    return any(_has_dictionary(t.field(i).type) for i in range(t.num_fields))


def encode_fence_sentinel(writer_epoch: int, position: int) -> bytes:
    """The empty entry a new writer puts at the WAL tail (``position``) to fence the previous
    one."""
    metadata = {_SENTINEL: b"true", _EPOCH: str(writer_epoch).encode()}
    return _checksummed(_header_template(pa.schema([]), metadata), [_END_OF_STREAM], position)


def decode_wal_entry(data: bytes | memoryview, position: int) -> WalEntry:
    """Parse a WAL entry; :class:`CorruptWalEntryError` if it is truncated or malformed."""
    if bytes(data[-len(_END_OF_STREAM) :]) != _END_OF_STREAM:
        # Writers (ours and Lance's) always finish the stream; without the marker the entry may
        # have lost whole record batches and still parse.
        raise CorruptWalEntryError(
            f"WAL entry at position {position} has no end-of-stream marker: it is truncated; "
            "restore it from a backup" + _SET_ASIDE
        )
    _check_checksum(data, position)
    try:
        reader = pa.ipc.open_stream(pa.BufferReader(data))
        batches = tuple(reader)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        raise CorruptWalEntryError(
            f"WAL entry at position {position} is not a complete Arrow IPC stream ({e}); "
            "it may be truncated: restore it from a backup" + _SET_ASIDE
        ) from e
    meta = reader.schema.metadata or {}
    if _EPOCH not in meta:
        raise CorruptWalEntryError(f"WAL entry at position {position} has no writer_epoch")
    try:
        epoch = int(meta[_EPOCH])
        generation = int(meta[_GENERATION]) if _GENERATION in meta else None
    except ValueError as e:
        raise CorruptWalEntryError(f"WAL entry at position {position}: bad metadata {e}") from e
    return WalEntry(
        position=position,
        writer_epoch=epoch,
        generation=generation,
        is_sentinel=meta.get(_SENTINEL) == b"true",
        batches=batches,
        checksummed=_CHECKSUM in meta,
    )


@dataclass(frozen=True)
class WalRun:
    """Entries at consecutive positions with one schema message (a writer's entries of one
    MemTable generation, a claim's sentinels, or a single entry), decoded together: their rows
    in order, not told apart by entry."""

    first: int
    count: int
    writer_epoch: int
    generation: int | None
    is_sentinel: bool
    checksummed: bool
    batches: tuple[pa.RecordBatch, ...]

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    @classmethod
    def of(cls, entry: WalEntry) -> WalRun:
        """The run of one entry."""
        return cls(
            entry.position,
            1,
            entry.writer_epoch,
            entry.generation,
            entry.is_sentinel,
            entry.checksummed,
            entry.batches,
        )


def decode_wal_runs(datas: Sequence[bytes | None], first: int) -> list[WalRun | None]:
    """The entries at positions ``first``, ``first + 1``, ... read as ``datas``, decoded in
    runs (:class:`WalRun`), in order; a None stands for one position to look at alone: its
    entry is missing, not whole, or not memwal-sql's (:func:`decode_wal_entry` says which).

    For the thousands of entries a claim replays, at a fraction of :func:`decode_wal_entry`'s
    cost: the entries of a run share their schema message but for the checksum's digits, so
    it is parsed once; each entry's checksum is checked on its raw bytes; and the record
    batches of the whole run are decoded as one IPC stream.

    Example:
        >>> b = pa.record_batch({"id": [1], "_tombstone": [False]})
        >>> datas = [encode_wal_entry([b], b.schema, writer_epoch=2, generation=1, position=p)
        ...          for p in (5, 6)]
        >>> [(r.first, r.count, r.batches[0].num_rows) if r else None
        ...  for r in decode_wal_runs([*datas, None], 5)]
        [(5, 2, 2), None]
    """
    headers: dict[bytes, _Header] = {}
    out: list[WalRun | None] = []
    run: list[pa.Buffer] = []  # the record batch messages of each entry of the run
    run_header: _Header | None = None
    for position, data in enumerate(datas, first):
        header, body = _checked_parts(data, position, headers) if data else (None, None)
        if run and header is not run_header:
            out += _decode_run(run_header, position - len(run), run)
            run = []
        if header is None or body is None or (header.is_sentinel and body.size):
            out.append(None)
        else:
            run.append(body)
            run_header = header
    return out + _decode_run(run_header, first + len(datas) - len(run), run)


@dataclass(frozen=True)
class _Header:
    """An entry's schema message, parsed: what :func:`decode_wal_runs` decodes once."""

    message: bytes
    schema: pa.Schema
    writer_epoch: int
    generation: int | None
    is_sentinel: bool


def _checked_parts(
    data: bytes, position: int, headers: dict[bytes, _Header]
) -> tuple[_Header | None, pa.Buffer | None]:
    """The parsed header and the record batch messages (without the end-of-stream marker) of
    memwal-sql's entry ``data`` at ``position``, once its checksum holds; Nones otherwise."""
    nothing = None, None
    if not data.endswith(_END_OF_STREAM):
        return nothing
    buf = pa.py_buffer(data)
    n = _schema_message_length(buf)
    if not 8 <= n <= len(data) - len(_END_OF_STREAM):
        return nothing
    message = data[:n]
    body = buf.slice(n)
    zeroed = _checked_header(message, body, position) if _CHECKSUM_STRING in message else None
    if zeroed is None:
        return nothing
    header = headers.get(zeroed)
    if header is None:
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(message))
            meta = schema.metadata or {}
            header = _Header(
                message,
                schema,
                int(meta[_EPOCH]),
                int(meta[_GENERATION]) if _GENERATION in meta else None,
                meta.get(_SENTINEL) == b"true",
            )
        except (pa.ArrowException, KeyError, ValueError):
            return nothing
        headers[zeroed] = header
    return header, body.slice(0, body.size - len(_END_OF_STREAM))


def _decode_run(header: _Header | None, first: int, run: list[pa.Buffer]) -> list[WalRun | None]:
    """The run of entries from ``first`` with ``header`` and the record batch messages
    ``run``, as one :class:`WalRun` (a None per entry if they do not decode)."""
    if not run or header is None:
        return []
    batches: tuple[pa.RecordBatch, ...] = ()
    if not header.is_sentinel:
        try:
            stream = b"".join([header.message, *run, _END_OF_STREAM])
            batches = tuple(pa.ipc.open_stream(stream).read_all().combine_chunks().to_batches())
        except (pa.ArrowException, OSError):
            return [None] * len(run)
    return [
        WalRun(
            first,
            len(run),
            header.writer_epoch,
            header.generation,
            header.is_sentinel,
            True,
            batches,
        )
    ]


def read_wal_entry(store: ObjectStore, region_id: str, position: int) -> WalEntry | None:
    """The entry at ``position``, or None if there is none."""
    try:
        data = store.get(layout.wal_entry_path(region_id, position))
    except ObjectNotFoundError:
        return None
    return decode_wal_entry(data, position)


def iter_wal(
    store: ObjectStore,
    region_id: str,
    after: int,
    *,
    list_for_gaps: bool = False,
    warn_torn_tail: bool = True,
    last_seen: int | None = None,
) -> Iterator[WalEntry]:
    """Entries at ``after + 1, after + 2, ...`` until the first missing position (WAL replay).

    Writers append at consecutive positions, so an entry after the first missing position means
    the WAL lost one: :class:`MissingWalEntryError`, rather than a replay that silently stops
    short (and a next writer whose sentinel fills the hole and fences itself). Readers check
    the next position only (one request); a claiming writer passes ``list_for_gaps`` to list the
    whole WAL, which GC keeps small except for fence sentinels.

    A torn last entry (:func:`is_torn_tail`) ends the WAL, with a :class:`TornWalEntryWarning`
    unless ``warn_torn_tail`` is False (a claiming writer sets it aside and warns itself). A
    hole whose entry is found whole in ``torn_wal/`` (set aside by a claiming writer that lost
    a race) is filled from there, and so is the first free position when a writer claims.

    ``last_seen``: the region manifest's ``wal_entry_position_last_seen``. Past it, a hole or
    a torn entry followed by nothing but fence sentinels ends the WAL too
    (:func:`only_sentinels_after`): a claim that did not finish leaves that.
    """
    position, recheck = after + 1, RECOVERY_LOOKS
    while True:
        entry, torn = read_wal_position(store, region_id, position, last_seen)
        if torn is not None:
            later = _later_positions(store, region_id, position, list_for_gaps)
            if later and not _claim_left(store, region_id, position, last_seen):
                if (recheck := recheck - 1) > 0:
                    continue  # a writer may have just recovered it and appended: look again
                raise torn  # entries after it: a damaged stored entry
            if warn_torn_tail:
                warnings.warn(
                    TornWalEntryWarning(
                        f"region {region_id}: the last WAL entry (position {position}) is torn by "
                        f"a crash of the machine during its put ({torn}); it was never "
                        "acknowledged and is left out. The next writer of the region moves it "
                        "aside"
                    ),
                    stacklevel=2,
                )
            return
        if entry is None:
            later = _later_positions(store, region_id, position, list_for_gaps)
            if not later and not list_for_gaps:
                return
            # A claiming writer looks in torn_wal/ at the tail too: a sentinel wrongly set
            # aside there is the one that fences an older writer still appending.
            entry = put_back_set_aside(store, region_id, position)
            if entry is None:
                if not later:
                    return
                if (
                    store.exists(layout.wal_entry_path(region_id, position))
                    and (recheck := recheck - 1) > 0
                ):
                    continue  # put just now: read it
                if _claim_left(store, region_id, position, last_seen):
                    return
                raise missing_wal_entry(region_id, position, max(later))
        yield entry
        position, recheck = position + 1, RECOVERY_LOOKS


def read_wal_range(store: ObjectStore, region_id: str, after: int, through: int) -> list[WalEntry]:
    """The entries at ``after + 1`` through ``through``, in order, read side by side: a range a
    snapshot pinned, every position of which was written. A missing one is a
    :class:`MissingWalEntryError`.

    Example:
        ``[e.position for e in read_wal_range(store, region_id, 4, 6)]  # [5, 6]``
    """
    positions = range(after + 1, through + 1)
    datas = store.get_many([layout.wal_entry_path(region_id, p) for p in positions])
    out = []
    for position, data in zip(positions, datas):
        if data is None:
            raise missing_wal_entry(region_id, position, through)
        out.append(decode_wal_entry(data, position))
    return out


def missing_wal_entry(region_id: str, position: int, last: int) -> MissingWalEntryError:
    """The error for a hole at ``position`` in a WAL that has entries up to ``last``."""
    return MissingWalEntryError(
        f"region {region_id} has no WAL entry at position {position} but has entries up to "
        f"{last}: an entry was lost. Restore it from a backup; or, to give up every write from "
        f"position {position} on, delete the entries after it too"
    )


def read_wal_position(
    store: ObjectStore, region_id: str, position: int, last_seen: int | None = None
) -> tuple[WalEntry | None, CorruptWalEntryError | None]:
    """What the WAL holds at ``position``: ``(entry, None)``, ``(None, None)`` if nothing, or
    ``(None, damage)`` if a torn tail (:func:`is_torn_tail`, given ``last_seen``); a damaged
    entry that is not one raises :class:`CorruptWalEntryError`.

    Damage is judged by looking at the position again, so it is only confirmed on bytes that
    are still there afterwards: a claiming writer may be setting a torn tail aside and putting
    its sentinel there at this moment.
    """
    path = layout.wal_entry_path(region_id, position)
    try:
        data = store.get(path)
    except ObjectNotFoundError:
        return None, None
    try:
        return decode_wal_entry(data, position), None
    except CorruptWalEntryError as damage:
        error = damage
    for _ in range(RECOVERY_LOOKS):
        torn = is_torn_tail(store, region_id, position, last_seen)
        try:
            again = store.get(path)
        except ObjectNotFoundError:
            return None, None  # set aside meanwhile
        if again == data:
            if torn:
                return None, error
            raise error
        try:
            return decode_wal_entry(again, position), None
        except CorruptWalEntryError as damage:
            data, error = again, damage
    raise error


def _later_positions(
    store: ObjectStore, region_id: str, position: int, list_all: bool
) -> list[int]:
    """Positions after ``position`` that hold entries: every one (a listing) or the next only
    (one request)."""
    if list_all:
        return [p for p in wal_positions(store, region_id) if p > position]
    return [position + 1] if store.exists(layout.wal_entry_path(region_id, position + 1)) else []


def only_sentinels_after(store: ObjectStore, region_id: str, position: int) -> bool:
    """True if every WAL entry after ``position`` is a whole fence sentinel.

    What a claim leaves that did not finish (its process killed, or the machine crashed) before
    its sentinels were synced and recorded in the region manifest (``last_seen``): it may have
    leapt ahead of the previous writer and not yet filled the positions it leapt over, and the
    previous writer's last put, or positions it filled, may not be durable. Past the manifest's
    ``last_seen``, a hole or a torn entry followed by such sentinels only is where the WAL's
    rows end, not a lost write (see docs/durability.md); the next claim fills it.
    """
    later = [p for p in wal_positions(store, region_id) if p > position]
    for p in later:
        try:
            entry = read_wal_entry(store, region_id, p)
        except CorruptWalEntryError:
            return False
        if entry is None or not entry.is_sentinel:
            return False
    return bool(later)


def _claim_left(store: ObjectStore, region_id: str, position: int, last_seen: int | None) -> bool:
    """Whether the hole or torn entry at ``position`` is one an unfinished claim left."""
    return (
        last_seen is not None
        and position > last_seen
        and only_sentinels_after(store, region_id, position)
    )


def put_back_set_aside(store: ObjectStore, region_id: str, position: int) -> WalEntry | None:
    """A whole entry for ``position`` found in the region's ``torn_wal/``, put back into the WAL,
    or None. Only for a hole before later entries: a claiming writer that set aside another's
    valid sentinel, and died before putting it back, left it there (the checksum proves which
    position an entry was written for)."""
    name = f"/{layout.bitrev64(position)}."
    for meta in store.list(f"{layout.region_dir(region_id)}/torn_wal/"):
        if name not in meta.path:
            continue
        try:
            entry = decode_wal_entry(store.get(meta.path), position)
        except (CorruptWalEntryError, ObjectNotFoundError):
            continue
        try:
            store.move(meta.path, layout.wal_entry_path(region_id, position))
        except (ObjectExistsError, ObjectNotFoundError):
            return read_wal_entry(store, region_id, position)  # put back by someone else
        except StorageError:
            pass  # a reader that may not write: it still reads the entry
        return entry
    return None


def is_torn_tail(
    store: ObjectStore, region_id: str, position: int, last_seen: int | None = None
) -> bool:
    """True if the damaged entry at ``position`` is a put that a crash of the machine cut short:
    the last entry, on local disk, last written before the machine started (or gone since: set
    aside). Its writer died with the machine before the put returned, so nobody was told it
    was stored. Anything else damaged is real corruption of a stored entry.

    With ``last_seen`` (the manifest's ``wal_entry_position_last_seen``), "the last entry" may
    also be followed by fence sentinels past ``last_seen``: a claim that the crash cut short
    (:func:`only_sentinels_after`).
    """
    if store.exists(layout.wal_entry_path(region_id, position + 1)) and not _claim_left(
        store, region_id, position, last_seen
    ):
        return False
    try:
        return store.written_before_boot(layout.wal_entry_path(region_id, position))
    except ObjectNotFoundError:
        return True


def set_aside_torn_entry(
    store: ObjectStore, region_id: str, position: int
) -> tuple[str | None, WalEntry | None]:
    """Move the torn entry at ``position`` out of the WAL (kept for inspection under the
    region's ``torn_wal/``), freeing its position. Returns where it went, or, if what was
    moved turns out whole (another claiming writer put its sentinel there after the caller
    looked), that entry, put back; ``(None, None)`` if the entry was gone (moved by another).
    """
    path = layout.wal_entry_path(region_id, position)
    to = layout.torn_wal_entry_path(region_id, position, time.time_ns())
    try:
        store.move(path, to)
        entry = decode_wal_entry(store.get(to), position)
    except ObjectNotFoundError:
        return None, None
    except CorruptWalEntryError:
        return to, None
    try:
        store.move(to, path)
    except (ObjectExistsError, ObjectNotFoundError):
        return None, None  # put back by a reader, or the position taken again: look again
    return None, entry


def set_aside_damaged_entry(store: ObjectStore, region_id: str, position: int) -> str:
    """Move the damaged *last* WAL entry at ``position`` to the region's ``torn_wal/``, giving
    up its rows; return where it went. For a damaged tail that is not known to be torn (written
    since the machine started, or on a volume from another machine), after checking why.

    Refuses an entry that reads well (:class:`InvalidInputError`) and one with entries after it
    (:class:`CorruptWalEntryError`: setting it aside would make a hole before them); a
    ``region_id`` that is no UUID or a position out of range is :class:`InvalidInputError`.
    """
    region_id, position = layout.region_id_of(region_id), layout.wal_position_of(position)
    try:
        entry = read_wal_entry(store, region_id, position)
    except CorruptWalEntryError:
        pass
    else:
        if entry is None:
            raise ObjectNotFoundError(f"region {region_id} has no WAL entry at position {position}")
        raise InvalidInputError(
            f"the WAL entry at position {position} of region {region_id} reads well; only a "
            "damaged entry is set aside"
        )
    later = [p for p in wal_positions(store, region_id) if p > position]
    if later:
        raise CorruptWalEntryError(
            f"the damaged WAL entry at position {position} of region {region_id} has entries "
            f"after it (up to {max(later)}): setting it aside would cut them off. Restore it "
            "from a backup"
        )
    to, _ = set_aside_torn_entry(store, region_id, position)
    if to is None:
        raise CommitConflictError(
            f"the WAL entry at position {position} of region {region_id} changed while it was "
            "set aside (a writer is recovering the region); look at it again"
        )
    return to


def wal_positions(store: ObjectStore, region_id: str) -> list[int]:
    """Every position that holds a WAL entry (data or sentinel), ascending."""
    out = []
    for name in store.list_names(layout.wal_dir(region_id)):
        try:
            out.append(layout.parse_bitrev64(name))
        except ValueError:
            continue
    return sorted(out)
