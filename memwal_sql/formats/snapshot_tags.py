"""Tags: named pinned snapshots, kept until untagged (``tbl.tag``), like Lance's and Paimon's.

A tag is ``_mem_wal/_tags/{name}.json`` holding the snapshot's token, created with a
put-if-not-exists (two processes tagging one name: one wins). The table's layer above also tags
the snapshot's base version in Lance (``memwal-snapshot-{name}``), so that no cleanup of old
versions removes it, and garbage collection keeps what every tagged snapshot reads.

Example:
    >>> from memwal_sql.storage import ObjectStore
    >>> store = ObjectStore("memory://doc-tags")
    >>> put_tag(store, "daily", "mw1.abc")
    >>> read_tags(store)
    {'daily': 'mw1.abc'}
"""

from __future__ import annotations

import json
import re

from memwal_sql.errors import InvalidSnapshotError, ObjectExistsError, ObjectNotFoundError
from memwal_sql.storage import ObjectStore, layout

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_tag_name(name: str) -> str:
    """``name`` if it can name a tag: letters, digits, ``.``, ``_``, ``-``, at most 100."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidSnapshotError(
            f"a tag name is 1-100 letters, digits, '.', '_' or '-' (starting with a letter or "
            f"digit), not {name!r}"
        )
    return name


def _path(name: str) -> str:
    return f"{layout.SNAPSHOT_TAGS}/{check_tag_name(name)}.json"


def put_tag(store: ObjectStore, name: str, token: str) -> None:
    """Record tag ``name`` for the snapshot ``token``; an existing tag of that name is an
    :class:`~memwal_sql.errors.InvalidSnapshotError`."""
    try:
        store.put_if_not_exists(_path(name), json.dumps({"token": token}).encode())
    except ObjectExistsError as e:
        raise InvalidSnapshotError(
            f"tag {name!r} exists already: untag it first (tbl.untag({name!r}))"
        ) from e


def read_tag(store: ObjectStore, name: str) -> str:
    """The token of tag ``name`` (:class:`~memwal_sql.errors.InvalidSnapshotError` if none)."""
    try:
        return str(json.loads(store.get(_path(name)))["token"])
    except ObjectNotFoundError as e:
        raise InvalidSnapshotError(
            f"no tag {name!r}; the tags are {sorted(read_tags(store))}"
        ) from e


def read_tags(store: ObjectStore) -> dict[str, str]:
    """Every tag's name and token."""
    names = [
        n[: -len(".json")] for n in store.list_names(layout.SNAPSHOT_TAGS) if n.endswith(".json")
    ]
    out = {}
    for name in sorted(names):
        try:
            out[name] = str(json.loads(store.get(f"{layout.SNAPSHOT_TAGS}/{name}.json"))["token"])
        except ObjectNotFoundError:
            continue  # untagged while listed
    return out


def delete_tag(store: ObjectStore, name: str) -> None:
    """Remove tag ``name`` (:class:`~memwal_sql.errors.InvalidSnapshotError` if none)."""
    read_tag(store, name)
    store.delete(_path(name))
