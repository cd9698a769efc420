"""What a leaf is: one source of a snapshot read by one access method.

A snapshot's sources are of three kinds (the base table, a flushed generation, a MemTable or
WAL tail), and each is read in one of four ways, an *access method*: :class:`Scan` its rows,
:class:`Lookup` keys, :class:`Knn` nearest rows, :class:`FullText` documents. One leaf class
per kind (``BaseSourceExec``, ``GenerationSourceExec``, ``MemTableSourceExec``) holds what is
specific to the kind (how it is opened and cached); :class:`SourceLeaf`, their base, holds
what is specific to the access: the protocol the leaf's parent calls and what ``execute``
runs.

* ``Scan``: ``read_counted(columns, predicate)``, called by ``DeduplicateExec`` (the base
  table's scan is a partitioned leaf of its own, run by ``execute``).
* ``Lookup``: ``probe(keys)`` (:class:`KeyProbe`), called by ``CoalesceFirstExec`` and the
  other lookup nodes.
* ``Knn``: ``top(n)`` and ``rows(candidates)``, called by ``FilterStaleExec``.
* ``FullText``: ``pieces()`` and ``piece_rows(piece, index)``, called by ``GlobalBM25Exec``;
  the base also ``text_index()``, ``key_addresses(keys)`` and ``rows_at(addresses)`` when it is
  searched through its inverted index.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import ExecNode
from exec_nodes.fts_index import BaseTextIndex
from memwal_sql.compat.lance import take_rows
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.expressions.substrait import lance_filter
from memwal_sql.expressions.visitors import evaluate, matches
from memwal_sql.formats.source_rows import (
    GEN,
    ROWADDR,
    TOMBSTONE,
    conform,
    empty_rows,
    stored_columns,
)
from memwal_sql.formats.tokenizer import Tokenizer
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.keyset import KeySet
from memwal_sql.structures.vectors import (
    DISTANCE,
    distances,
    rough_distances,
    smallest,
    with_distance,
)
from memwal_sql.writer.memtable_indexes import Piece

# --- access methods -----------------------------------------------------------------------


@dataclass(frozen=True)
class FragmentRange:
    """Rows ``start`` to ``end`` (physical offsets, end excluded) of base fragment
    ``fragment_id``; ``end=None`` means to the fragment's end."""

    fragment_id: int
    start: int = 0
    end: int | None = None

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end is None

    def __str__(self) -> str:
        if self.whole:
            return str(self.fragment_id)
        return f"{self.fragment_id}[{self.start}:{'' if self.end is None else self.end}]"


@dataclass(frozen=True)
class Scan:
    """Read the source's rows. The base table takes its projection, filter and row ranges
    here (it is a plan's partitioned leaf); a newer source is given them per read, by
    deduplication (:meth:`SourceLeaf.read_counted`), and takes none here.

    Example:
        >>> Scan(columns=("id",)).columns
        ('id',)
    """

    columns: tuple[str, ...] | None = None
    predicate: Predicate | None = None
    ranges: tuple[FragmentRange, ...] | None = None  # of the base table; None: all of it
    batch_size: int | None = None
    # The base table's filtered scan evaluates its filter over the fragments kept whole in the
    # lookup cache (read once), not through a Lance scan per query.
    in_memory: bool = False

    def __str__(self) -> str:
        return "scan"


@dataclass(frozen=True)
class Lookup:
    """Probe the source by ``primary_key`` (:class:`KeyProbe`); the base table may be limited
    to ``fragment_ids``. With ``versions``, a source newer than the base gives only each
    key's version (:func:`version_schema`), not its row.

    Example:
        >>> str(Lookup(("id",), versions=True))
        'lookup key=[id] versions only'
    """

    primary_key: tuple[str, ...]
    fragment_ids: tuple[int, ...] | None = None
    # What deciding which version of a key is newest needs (a search's stale check): a
    # generation then reads two columns, not the candidates' vectors and texts.
    versions: bool = False

    def __str__(self) -> str:
        return f"lookup key=[{', '.join(self.primary_key)}]" + (
            " versions only" if self.versions else ""
        )


def version_schema(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    """The columns of a key's version in a newer source: the key, ``_tombstone``, ``_gen`` and
    ``_rowaddr`` (what ``Lookup(versions=True)`` gives).

    Example:
        >>> s = pa.schema([("id", pa.int64()), ("v", pa.string()), (TOMBSTONE, pa.bool_()),
        ...                (GEN, pa.int64()), (ROWADDR, pa.uint64())])
        >>> version_schema(s, ["id"]).names
        ['id', '_tombstone', '_gen', '_rowaddr']
    """
    return pa.schema([schema.field(c) for c in (*primary_key, TOMBSTONE, GEN, ROWADDR)])


@dataclass(frozen=True)
class KnnQuery:
    """What one vector search asks every source: the ``k`` rows nearest to ``vector`` by
    ``column`` and ``metric``, among those matching ``predicate``, keyed by ``primary_key``.

    Example:
        >>> KnnQuery("vec", np.zeros(2, np.float32), "l2", None, 10, ("id",)).k
        10
    """

    column: str
    vector: np.ndarray
    metric: str
    predicate: Predicate | None
    k: int
    primary_key: tuple[str, ...]


@dataclass(frozen=True)
class Knn:
    """The source's nearest rows for ``query``; the base table searches its vector ``index``
    (``nprobes`` partitions, candidates re-ranked with ``refine_factor``), when it has one;
    given ``fragment_ids`` (those the index covers), only their rows, through the index (the
    indexed read plan searches the gap generations for the rest).

    Example:
        >>> q = KnnQuery("vec", np.zeros(2, np.float32), "l2", None, 10, ("id",))
        >>> str(Knn(q))
        'knn k=10'
    """

    query: KnnQuery
    index: str | None = None
    nprobes: int | None = None
    refine_factor: int | None = None
    fragment_ids: tuple[int, ...] | None = None

    def __str__(self) -> str:
        return f"knn k={self.query.k}"


@dataclass(frozen=True)
class FullText:
    """The source's documents of ``column``, tokenized by ``tokenizer``, keyed by
    ``primary_key`` (what BM25 over the latest corpus gathers).

    Example:
        ``FullText("text", tokenizer_for({}, caches), ("id",))``
    """

    column: str
    tokenizer: Tokenizer
    primary_key: tuple[str, ...]

    def __str__(self) -> str:
        return f"full text column={self.column}"


@dataclass(frozen=True)
class PieceKeys:
    """What a full-text search needs of a :class:`Piece` to find each key's latest version:
    its rows' keys, row addresses and which rows are present (no terms)."""

    keys: pa.Table
    addresses: np.ndarray
    present: np.ndarray

    @classmethod
    def of(cls, piece: Piece) -> PieceKeys:
        """``piece``'s own arrays (a search names what it derived from them by them)."""
        return cls(piece.keys, piece.addresses, piece.present)


Access = Scan | Lookup | Knn | FullText
A = TypeVar("A", Scan, Lookup, Knn, FullText)


# --- the protocols parents call -----------------------------------------------------------


class Probe(NamedTuple):
    """What probing a source by key gives: the newest row of each key found there
    (tombstones included) and, per probed key, whether it was found."""

    rows: pa.Table
    hit: np.ndarray


@runtime_checkable
class KeyProbe(Protocol):
    """Probing by key, the lookup leaves' protocol beside the exec-node contract: the newest
    row of each of ``keys`` the source holds (tombstones included) and which keys it found.

    Example:
        ``MemTableSourceExec(rid, 3, rows, schema, Lookup(("id",)), caches=c).probe(keys)``
    """

    def probe(self, keys: pa.Table) -> Probe: ...


class KeyedExec(ExecNode, KeyProbe):
    """A lookup operator: an exec node that is also a :class:`KeyProbe`. The planner binds
    the keys it is to answer (``keys``), so :meth:`execute` runs it like any other node;
    a parent that narrows the keys (``CoalesceFirstExec``) probes it directly."""

    keys: pa.Table | None = None

    def probe(self, keys: pa.Table) -> Probe:
        raise NotImplementedError

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        if self.keys is None:
            raise ValueError(f"{self.name} has no keys bound; probe(keys) it instead")
        yield from self.probe(self.keys).rows.to_batches()


class KnnSource(ExecNode):
    """One source's nearest rows (a leaf with :class:`Knn` access, or a composite over
    several generations). ``top(n)`` is computed once per ``n`` and kept, so asking again
    for the same or fewer rows costs nothing."""

    _locks: tuple[str, ...] = ("_lock",)
    _computed: tuple[str, ...] = ("_top",)
    #: Searched by Lance, which releases the GIL: :class:`~exec_nodes.stale.FilterStaleExec`
    #: runs such sources on its threads while it searches the others (numpy) in its own.
    in_lance: bool = False

    def __init__(
        self, region_id: str | None, generation: int, schema: pa.Schema, search: KnnQuery
    ) -> None:
        self.region_id = region_id
        self.generation = generation
        self.source_schema = schema
        self._lock = threading.Lock()
        self._search(search)

    def _search(self, search: KnnQuery) -> None:
        self.primary_key = list(search.primary_key)
        # Candidates are light: which row (key, _gen, _rowaddr) and how near; the k that win
        # are read in full afterwards (:meth:`rows`), never every candidate's vector and text.
        self._schema = with_distance(
            pa.schema([self.source_schema.field(c) for c in (*self.primary_key, GEN, ROWADDR)])
        )
        self.column = search.column
        self.query = search.vector
        self.metric = search.metric
        self.predicate = search.predicate
        self.k = search.k
        self._top: tuple[int, pa.Table] | None = None

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def top(self, n: int) -> pa.Table:
        """The ``n`` nearest rows matching the predicate, nearest first (fewer if the source
        has fewer)."""
        with self._lock:
            if self._top is None or (self._top[0] < n and self._top[1].num_rows == self._top[0]):
                self._top = (n, self._nearest(n))
            return self._top[1].slice(0, n)

    def fetched(self) -> int:
        """How many rows the last ``top`` call asked for (0 before any)."""
        return 0 if self._top is None else self._top[0]

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        yield from self.top(self.k).to_batches()

    def _nearest(self, n: int) -> pa.Table:
        raise NotImplementedError

    def rows(self, candidates: pa.Table) -> pa.Table:
        """The source's full rows (its source schema) of ``candidates`` it returned (by their
        ``_gen`` and ``_rowaddr``), in that order."""
        raise NotImplementedError

    def _exact(
        self,
        rows: pa.Table,
        matrix: np.ndarray,
        live: np.ndarray,
        sq_norms: np.ndarray,
        n: int,
    ) -> pa.Table:
        """The ``n`` nearest of ``rows`` (``matrix`` their vectors, ``live`` the rows that may
        be neighbours, ``sq_norms`` their squared norms), matching the predicate, computed in
        numpy: candidates by :func:`rough_distances`, twice as many as asked (its rounding,
        about 1e-7 of the squared norms, only swaps rows that near), then ranked by Lance's
        exact distance."""
        if self.predicate is not None:
            live = live & evaluate(self.predicate, rows).fill_null(False).to_numpy(
                zero_copy_only=False
            )
        rough = rough_distances(matrix, sq_norms, self.query, self.metric)
        rough[~live | np.isnan(rough)] = np.inf
        n = min(n, int(np.count_nonzero(np.isfinite(rough))))
        if n == 0:
            return empty_rows(self.schema)
        chosen = smallest(rough, 2 * n)
        chosen = chosen[np.isfinite(rough[chosen])]
        dist = distances(matrix[chosen], self.query, self.metric)
        dist[np.isnan(dist)] = np.inf
        order = np.lexsort((chosen, dist))[:n]
        best, dist = chosen[order], dist[order]
        out = rows.select(self.schema.names[:-1]).take(pa.array(best))
        return out.append_column(self.schema.field(DISTANCE), pa.array(dist, pa.float32()))


# --- the leaf -----------------------------------------------------------------------------


class SourceLeaf(KeyedExec, KnnSource):
    """One source of a snapshot (``region_id``/``generation``; its rows in the source
    ``schema``: base columns, ``_tombstone``, ``_gen``, ``_rowaddr``) read by ``access``.

    The leaf offers the protocol of its access method (see the module docstring) and
    ``execute`` runs it; a kind implements the primitives behind each protocol: ``read``
    (scan), ``_probe`` (lookup), ``_nearest`` and ``rows`` (KNN), ``pieces`` and
    ``piece_rows`` (full text). Each leaf counts how often it was opened (``opened``, by a
    scan) or probed (``probes``): tests check what a plan touched.
    """

    _locks: tuple[str, ...] = ("_lock",)
    _computed: tuple[str, ...] = ("_top", "_pieces")

    def __init__(
        self,
        region_id: str | None,
        generation: int,
        schema: pa.Schema,
        access: Access,
        *,
        caches: Caches,
        keys: pa.Table | None = None,
    ) -> None:
        self.region_id = region_id
        self.generation = generation
        self.source_schema = schema
        self.access = access
        self.caches = caches
        self.keys = keys
        self.opened = 0
        self.probes = 0
        self._lock = threading.Lock()
        self._top = None
        self._pieces: list[Piece] | None = None
        self._schema = schema
        if isinstance(access, Lookup):  # first: a point lookup builds a leaf per source per key
            self.primary_key = list(access.primary_key)
            if access.versions:
                self._schema = version_schema(schema, self.primary_key)
        elif isinstance(access, Knn):
            self._search(access.query)
        elif isinstance(access, FullText):
            self.primary_key = list(access.primary_key)
            self.column = access.column

    def _needs(self, kind: type[A]) -> A:
        """The access method, if it is of ``kind`` (a parent calls its own protocol only)."""
        if not isinstance(self.access, kind):
            raise TypeError(
                f"{self.name} reads by {self.access}, not {kind.__name__}: build the leaf "
                f"with {kind.__name__}(...) access"
            )
        return self.access

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        access = self.access
        if isinstance(access, Scan):
            yield from self._scan(partition)
        elif isinstance(access, Lookup):
            yield from KeyedExec.execute(self, partition)
        elif isinstance(access, Knn):
            yield from self.top(self.k).to_batches()
        else:
            for i, piece in enumerate(self.pieces()):
                yield from self.piece_rows(i, np.nonzero(piece.present)[0]).to_batches()

    def describe(self) -> str:
        return f"{self.name}: {self._where()} {self._how()}".rstrip()

    def _where(self) -> str:
        """Which source this is (region, generation, where its rows are)."""
        raise NotImplementedError

    def _how(self) -> str:
        """How the access reads it."""
        return str(self.access)

    # Scan ---------------------------------------------------------------------------------

    def _scan(self, partition: int) -> Iterator[pa.RecordBatch]:
        yield from self.read_counted().to_batches()

    def read_counted(
        self, columns: Sequence[str] | None = None, predicate: Predicate | None = None
    ) -> pa.Table:
        """Read the source (``columns`` plus ``_gen``/``_rowaddr``; rows for which
        ``predicate`` is TRUE; all columns when there is a predicate), counting the open."""
        self._needs(Scan)
        self.count_open()
        schema = self.source_schema
        if columns is not None:
            names = [*columns, GEN, ROWADDR]
            schema = pa.schema([self.source_schema.field(c) for c in names])
        return self.read(schema, predicate)

    def read(self, schema: pa.Schema, predicate: Predicate | None) -> pa.Table:
        """The source's rows in ``schema`` (some of its columns) matching ``predicate``."""
        raise NotImplementedError

    def count_open(self) -> None:
        """Count one read of the source (what :meth:`read_counted` counts)."""
        with self._lock:
            self.opened += 1

    # Lookup -------------------------------------------------------------------------------

    def probe(self, keys: pa.Table) -> Probe:
        """The newest row (tombstones included) of each of ``keys`` present in this source,
        and a mask of the keys that were present."""
        self._needs(Lookup)
        with self._lock:
            self.probes += 1
        if keys.num_rows == 0:
            return Probe(empty_rows(self.schema), np.zeros(0, dtype=bool))
        found = self._probe(keys)
        if found.rows.schema.names != self.schema.names:  # versions only
            return Probe(found.rows.select(self.schema.names), found.hit)
        return found

    def _probe(self, keys: pa.Table) -> Probe:
        raise NotImplementedError

    def _take_newest(
        self,
        keys: pa.Table,
        keyset: KeySet,
        newest: np.ndarray,
        take: Callable[[np.ndarray], pa.Table],
    ) -> Probe:
        """Probe ``keyset`` and ``take`` the rows ``newest`` names for the keys it holds."""
        pos = keyset.positions(keys)
        hit = pos >= 0
        if not hit.any():
            return Probe(empty_rows(self.schema), hit)
        return Probe(take(newest[pos[hit]]), hit)

    # Knn ----------------------------------------------------------------------------------

    def top(self, n: int) -> pa.Table:
        self._needs(Knn)
        return KnnSource.top(self, n)

    # FullText -----------------------------------------------------------------------------

    def pieces(self) -> list[Piece]:
        """The source's documents as :class:`Piece` s (keys, row addresses, terms, which
        rows are present), computed once per leaf."""
        self._needs(FullText)
        with self._lock:
            if self._pieces is None:
                self._pieces = self._text_pieces()
            return self._pieces

    def _text_pieces(self) -> list[Piece]:
        raise NotImplementedError

    def text_keys(self) -> list[PieceKeys] | None:
        """The keys of :meth:`pieces` (the same rows in the same order) when the source has
        them without tokenizing (a MemTable's rows), else None: a search finds the rows
        newer sources supersede from them while the pieces are tokenized.

        Example:
            ``memtable_leaf.text_keys()[0].keys`` -> the key columns of its piece's rows
        """
        return None

    def piece_rows(self, piece: int, index: np.ndarray) -> pa.Table:
        """Full rows (source schema) of piece ``piece`` at row indices ``index``."""
        raise NotImplementedError

    def text_index(self) -> BaseTextIndex | None:
        """The inverted index this source is searched through besides its ``pieces()`` (the
        base's, for the fragments it covers), or None."""
        return None

    def key_addresses(self, keys: pa.Table) -> np.ndarray:
        """With a ``text_index``: the row address of the live row holding each of ``keys``,
        or -1."""
        raise NotImplementedError

    def rows_at(self, addresses: np.ndarray) -> pa.Table:
        """With a ``text_index``: full rows (source schema) at row ``addresses``."""
        raise NotImplementedError

    def _piece(self, rows: pa.Table, addresses: np.ndarray) -> Piece:
        access = self._needs(FullText)
        tokens = access.tokenizer.tokenize(rows.column(access.column))
        present = np.ones(rows.num_rows, dtype=bool)
        if TOMBSTONE in rows.column_names and rows.num_rows:
            present &= ~rows.column(TOMBSTONE).to_numpy(zero_copy_only=False).astype(bool)
        return Piece(rows.select(self.primary_key), addresses, tokens, present)


# --- helpers the Lance-backed kinds (base, generation) share --------------------------------

_WHOLE_FRAGMENT_SHARE = 16  # a fragment read whole takes at most 1/16 of the cache


def whole_fragment(
    fragment: lance.LanceFragment,
    names: Sequence[str],
    generation: int,
    schema: pa.Schema,
    max_bytes: int,
) -> tuple[pa.Table | None, int]:
    """Every physical row of a small fragment in the source ``schema``, row ``i`` at offset
    ``i``, for a lookup cache of ``max_bytes``; ``(None, _)`` for a fragment too big to keep.

    Deleted rows are kept in place: key indexes never point at them, and so the rows serve
    every version of the fragment. One sequential read of a small fragment costs about what a
    few random ``take`` calls do (benchmarks/bench_lookup.py), and it
    serves every later lookup from memory, as RocksDB serves hot blocks from its block cache.
    """
    sizes = [f.file_size_bytes for f in fragment.data_files()]
    if any(n is None for n in sizes) or sum(sizes) > max_bytes // _WHOLE_FRAGMENT_SHARE:  # type: ignore[arg-type]
        return None, 64
    table = fragment.to_table(columns=list(names), with_row_id=True, include_deleted_rows=True)
    if table.num_rows != fragment.metadata.physical_rows:
        return None, 64
    table = conform(table.select(list(names)), schema, generation).combine_chunks()
    return table, table.nbytes


def take_addresses(
    ds: lance.LanceDataset, addresses: np.ndarray, schema: pa.Schema, generation: int
) -> pa.Table:
    """The rows of ``ds`` at row ``addresses``, in the source ``schema``."""
    names = stored_columns(schema, ds)
    row_ids = pa.array(np.asarray(addresses).astype(np.uint64))
    out = conform(take_rows(ds, row_ids, names), schema, generation)
    return out.set_column(out.schema.get_field_index(ROWADDR), schema.field(ROWADDR), row_ids)


def lance_nearest(
    ds: lance.LanceDataset,
    node: KnnSource,
    n: int,
    options: dict[str, object],
    generation: int,
    indexed_rows: int | None = None,
) -> pa.Table:
    """``n`` nearest rows of a Lance dataset, the filter applied before the search; with
    ``indexed_rows``, among the rows its vector index covers only (that many of them)."""
    light = node.schema.remove(len(node.schema) - 1)
    # Only the key comes back (and the row address): no vector or text of any candidate.
    names = list(node.primary_key)
    pushed, exact = lance_filter(node.predicate, ds.schema)
    if TOMBSTONE in ds.schema.names:  # a generation's tombstones are never neighbours
        live = ~pc.field(TOMBSTONE)
        pushed = live if pushed is None else pushed & live
    # Lance allocates for k (and k * refine_factor) candidates up front, whatever the rows: a
    # k past the rows it holds would abort the process, and asks for nothing more.
    rows = ds.count_rows() if indexed_rows is None else indexed_rows
    if rows == 0:
        return empty_rows(node.schema)
    k = min(n, rows)
    if node.predicate is not None and not exact:
        # Lance cannot take this filter: search all rows, then filter (exact, but slower).
        k = rows
        names = stored_columns(node.source_schema, ds)
    refine = options.get("refine_factor")
    if isinstance(refine, int) and refine * k > rows:
        options = {**options, "refine_factor": -(-rows // k)}  # already every row refined
    nearest = {"column": node.column, "q": node.query, "k": k, "metric": node.metric, **options}
    # Named in the projection: Lance 14 warns (once per search) that it will stop adding it.
    table = ds.scanner(
        columns=[*names, DISTANCE],
        nearest=nearest,
        filter=pushed,
        prefilter=True,
        with_row_address=True,
        fast_search=indexed_rows is not None,  # Lance's name for "the indexed rows only"
    ).to_table()
    if not exact:
        table = matches(node.predicate, table).slice(0, n)
    dist = table.column(DISTANCE)
    out = conform(table, light, generation)
    return out.append_column(node.schema.field(DISTANCE), dist.cast(pa.float32()))


__all__ = [
    "Access",
    "FragmentRange",
    "FullText",
    "KeyProbe",
    "KeyedExec",
    "Knn",
    "KnnQuery",
    "KnnSource",
    "Lookup",
    "PieceKeys",
    "Probe",
    "Scan",
    "SourceLeaf",
    "lance_nearest",
    "take_addresses",
    "version_schema",
    "whole_fragment",
]
