"""Schema evolution: nullable columns added, non-null columns made nullable, while writers write.

The table's schema is its base table's: a change is one Lance commit (``add_columns``,
``alter_columns``) on the base, which Lance 14 allows on a MemWAL table because it rewrites no
data. WAL entries, generations and the MemTables of writers opened before the change keep the
schema they were written in, and every read and merge takes them into the new one (a missing
column NULL: ``formats.source_rows.conform``, ``formats.wal.conform_batch``).

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> tbl = mw.create_table(tempfile.mkdtemp(), pa.table({"id": [1], "n": [2]}), primary_key="id")
    >>> tbl.add_columns({"note": pa.string()})
    >>> tbl.to_arrow().to_pylist()
    [{'id': 1, 'n': 2, 'note': None}]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lance
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.compat.lance import is_commit_conflict, replace_field
from memwal_sql.errors import CommitConflictError, SchemaMismatchError
from memwal_sql.formats.source_rows import GEN, ROWADDR, WIDENS_METADATA
from memwal_sql.formats.wal import TOMBSTONE
from memwal_sql.storage import storage_error
from memwal_sql.table_state import TableState

_RESERVED = (TOMBSTONE, GEN, ROWADDR, "_rowid", "_distance", "_score")
_WIDENING_PREFIX = "_memwal_widening_"  # the hidden column a widening fills
_ATTEMPTS = 5  # commits lost to concurrent merges before the change gives up


def add_columns(table: TableState, columns: Mapping[str, pa.DataType] | Sequence[pa.Field]) -> None:
    """Add nullable ``columns`` to ``table``, NULL in every row written before.

    Example:
        ``add_columns(tbl, {"score": pa.float64(), "tags": pa.list_(pa.string())})``
    """
    fields = (
        [pa.field(n, t) for n, t in columns.items()]
        if isinstance(columns, Mapping)
        else list(columns)
    )
    if not fields:
        raise SchemaMismatchError("add_columns needs at least one column")
    table.follow_schema(table.dataset())  # checked against the latest schema, not this table's
    names = [f.name for f in fields]
    for f in fields:
        if f.name in table.schema.names or names.count(f.name) > 1:
            raise SchemaMismatchError(f"column {f.name!r} exists already: give a new name")
        if f.name in _RESERVED or f.name.startswith(_WIDENING_PREFIX):
            raise SchemaMismatchError(f"{f.name!r} is a name memwal-sql reserves: choose another")
        if not f.nullable:
            raise SchemaMismatchError(
                f"column {f.name!r} must be nullable: every row written before has no value"
            )
    _commit(table, lambda ds: ds.add_columns(pa.schema(fields)))


def alter_columns(table: TableState, *changes: Mapping[str, Any]) -> None:
    """Make columns of ``table`` nullable or widen their types, each change as Lance's
    ``alter_columns`` takes it: ``{"path": name, "nullable": True}``,
    ``{"path": name, "data_type": pa.int64()}``, or both.

    A widening (:func:`is_widening`: a wider integer or float, an integer to a float that holds
    it exactly, a decimal's precision) converts every stored value; a key, region or indexed
    column keeps its type, and so does a column made narrower or another type.

    Example:
        ``alter_columns(tbl, {"path": "score", "nullable": True})``
    """
    if not changes:
        raise SchemaMismatchError("alter_columns needs at least one change")
    table.follow_schema(table.dataset())
    widenings: list[tuple[str, pa.DataType]] = []
    for change in changes:
        name = str(change.get("path"))
        unknown = set(change) - {"path", "nullable", "data_type"}
        if unknown:
            raise SchemaMismatchError(
                f"alter_columns makes a column nullable or widens its type, it does not change "
                f"{sorted(unknown)} (a renamed or dropped column would break the rows written "
                "before)"
            )
        if name not in table.schema.names:
            raise SchemaMismatchError(
                f"no column {name!r} to alter; the columns are {table.schema.names}"
            )
        if "nullable" not in change and "data_type" not in change:
            raise SchemaMismatchError(f"nothing to change in {dict(change)}")
        if "nullable" in change and change["nullable"] is not True:
            raise SchemaMismatchError(
                f"column {name!r} can become nullable (nullable=True), not non-nullable: rows "
                "written before may hold NULL"
            )
        if name in table.primary_key:
            raise SchemaMismatchError(
                f"{name!r} is a key column: its type and nullability stay (a key is never NULL, "
                "and a wider key hashes to other regions)"
            )
        if "data_type" in change:
            widenings.append((name, _checked_widening(table, name, change["data_type"])))
    for name, data_type in widenings:
        _widen(table, name, data_type)
    nullable = [{"path": c["path"], "nullable": True} for c in changes if "nullable" in c]
    if nullable:
        # pylance annotates each alteration as an iterable of them; it takes the dicts.
        _commit(table, lambda ds: ds.alter_columns(*nullable))  # type: ignore[arg-type]


def is_widening(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of type ``old`` is exactly a value of type ``new`` (and the types
    differ): what Iceberg and Delta allow as type promotion.

    Example:
        >>> is_widening(pa.int32(), pa.int64()), is_widening(pa.int64(), pa.float64())
        (True, False)
    """
    if old.equals(new):
        return False
    if pa.types.is_integer(old) and pa.types.is_integer(new):
        wider = new.bit_width > old.bit_width
        return wider and (pa.types.is_signed_integer(new) or pa.types.is_unsigned_integer(old))
    if pa.types.is_floating(new) and (pa.types.is_integer(old) or pa.types.is_floating(old)):
        if pa.types.is_floating(old):
            return new.bit_width > old.bit_width
        mantissa = {16: 11, 32: 24, 64: 53}[new.bit_width]
        return old.bit_width - pa.types.is_signed_integer(old) <= mantissa
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return new.scale == old.scale and new.precision > old.precision
    return False


def _checked_widening(table: TableState, name: str, data_type: Any) -> pa.DataType:
    old = table.schema.field(name).type
    if not isinstance(data_type, pa.DataType) or not is_widening(old, data_type):
        raise SchemaMismatchError(
            f"column {name!r} ({old}) cannot become {data_type}: only a widening that keeps "
            "every value exactly (int32 to int64, float32 to float64, ...) is allowed. Add a "
            "column of the new type and fill it with UPDATE instead"
        )
    spec = table.region_spec
    if spec is not None and name in spec.source_columns:
        raise SchemaMismatchError(
            f"{name!r} routes rows to regions: its type stays (a wider value hashes elsewhere)"
        )
    indexed = [i["name"] for i in table.dataset().list_indices() if name in i["fields"]]
    if indexed:
        raise SchemaMismatchError(
            f"{name!r} is indexed by {indexed}: drop the index (dataset.drop_index), widen the "
            "column, then create the index again"
        )
    return data_type


def _widen(table: TableState, name: str, data_type: pa.DataType) -> None:
    """Give column ``name`` the wider ``data_type`` in the base table, in three commits that
    concurrent writers and merges never see half done:

    1. a hidden column of the new type (:data:`WIDENS_METADATA`), NULL everywhere, which every
       merge from then on fills with the merged rows' values (``conform``);
    2. the hidden column filled, by a ``merge_insert`` of the key and the value, for every row
       whose hidden value differs (rows a merge that started before 1 committed included),
       until a scan finds none;
    3. one ``Project`` commit, read at the version that scan checked, that drops the old column
       and gives the hidden one its name and place. A merge committed after that version
       makes the commit conflict, and 2 runs again.

    The new column takes a new field id, which WAL entries and generations written before do
    not carry: our readers match their columns by name and widen the values (Lance 14's reader
    matches by id, and reads those NULL until they are merged).
    """
    hidden = f"{_WIDENING_PREFIX}{name}"
    ds = table.dataset()
    if hidden in ds.schema.names:  # a widening interrupted before its last commit
        if not ds.schema.field(hidden).type.equals(data_type):
            raise SchemaMismatchError(
                f"an interrupted widening of {name!r} to {ds.schema.field(hidden).type} left "
                f"column {hidden!r}: finish it (alter_columns to that type) first"
            )
    else:
        field = pa.field(hidden, data_type, metadata={WIDENS_METADATA: name})
        _commit(table, lambda ds: ds.add_columns(pa.schema([field])))
    pk = list(table.primary_key)
    for _ in range(_ATTEMPTS * 4):
        ds = table.dataset()
        stale = _stale_rows(ds, pk, name, hidden)
        try:
            if stale.num_rows:
                ds.merge_insert(pk).when_matched_update_all().execute(stale)
            else:
                schema = replace_field(ds.lance_schema, name, hidden)
                lance.LanceDataset.commit(
                    ds.uri,
                    lance.LanceOperation.Project(schema),
                    read_version=ds.version,
                    storage_options=table.storage_options or None,
                )
                table.follow_schema(table.dataset())
                return
        except OSError as e:
            if not is_commit_conflict(e):
                raise storage_error(f"widening {name!r} of {table.uri}", e) from e
    raise CommitConflictError(
        f"widening {name!r} of {table.uri} lost every commit to concurrent merges; run it again "
        "(it continues where it stopped)"
    )


def _stale_rows(ds: lance.LanceDataset, pk: list[str], name: str, hidden: str) -> pa.Table:
    """Key and widened value of every row of ``ds`` whose hidden column differs from it."""
    wide_type = ds.schema.field(hidden).type
    out = []
    for batch in ds.to_batches(columns=[*pk, name, hidden]):
        wide = batch.column(name).cast(wide_type)
        have = batch.column(hidden)
        same = pc.fill_null(pc.equal(wide, have), pc.and_(pc.is_null(wide), pc.is_null(have)))
        stale = batch.filter(pc.invert(same))
        if stale.num_rows:
            out.append(
                pa.table(
                    [*stale.select(pk).columns, wide.filter(pc.invert(same))], names=[*pk, hidden]
                )
            )
    schema = pa.schema([*(ds.schema.field(k) for k in pk), pa.field(hidden, wide_type)])
    return pa.concat_tables(out) if out else schema.empty_table()


def _commit(table: TableState, change: Callable[[lance.LanceDataset], Any]) -> None:
    """Apply ``change`` to the latest base version, again on a newer one if a merge committed
    first; then ``table`` (reads, and writers opened from now on) takes the new schema."""
    for _ in range(_ATTEMPTS):
        ds = table.dataset()
        try:
            change(ds)
        except OSError as e:
            if is_commit_conflict(e):
                continue
            if "Invalid user input" in str(e):
                raise SchemaMismatchError(f"Lance refused the schema change: {e}") from e
            raise storage_error(f"changing the schema of {table.uri}", e) from e
        table.follow_schema(table.dataset())
        return
    raise CommitConflictError(
        f"the schema change of {table.uri} lost {_ATTEMPTS} commits to concurrent merges; retry"
    )
