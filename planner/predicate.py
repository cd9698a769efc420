"""Read a pushed-down pyarrow filter expression back into a predicate tree.

DataFusion hands a table's pushed filter to the dataset protocol as a ``pyarrow.compute``
Expression, which has no introspection API; its ``str()`` form follows a small regular grammar.
This parser reads that grammar conservatively: comparisons of a column with a literal,
``is_in`` with a literal set, ``and``/``or``/``invert``. Anything else (functions, casts, elided
``is_in`` sets, columns compared with columns) becomes :class:`Unknown`, which pruning treats as
"may match". A wrong parse can only make pruning keep more regions, never drop a needed one,
as long as what it does return is right, which the tests check against pyarrow itself.

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> schema = pa.schema([("id", pa.int64())])
    >>> parse_filter((pc.field("id") == 5) | pc.field("id").isin([7, 8]), schema)
    Or(left=Cmp(column='id', op='==', value=5), right=In(column='id', values=(7, 8)))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


class Node:
    """A predicate tree node."""


@dataclass(frozen=True)
class Unknown(Node):
    text: str = ""


@dataclass(frozen=True)
class And(Node):
    left: Node
    right: Node


@dataclass(frozen=True)
class Or(Node):
    left: Node
    right: Node


@dataclass(frozen=True)
class Not(Node):
    child: Node


@dataclass(frozen=True)
class Cmp(Node):
    column: str
    op: str  # == != < <= > >=
    value: Any


@dataclass(frozen=True)
class In(Node):
    column: str
    values: tuple[Any, ...]


_OPS = ("==", "!=", "<=", ">=", "<", ">")
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


class _ParseError(Exception):
    pass


def parse_filter(expr: pc.Expression | None, schema: pa.Schema) -> Node | None:
    """The predicate tree of ``expr`` (None for no filter)."""
    if expr is None:
        return None
    text = str(expr)
    try:
        node, pos = _Parser(text, schema).expr(0)
        if pos != len(text):
            return Unknown(text)
        return node
    except (_ParseError, IndexError, ValueError):
        return Unknown(text)


class _Parser:
    def __init__(self, text: str, schema: pa.Schema) -> None:
        self.s = text
        self.schema = schema

    def expr(self, pos: int) -> tuple[Node, int]:
        s = self.s
        if s.startswith("(", pos):
            left_text, pos2 = self._operand(pos + 1)
            for op in (" and ", " or "):
                if s.startswith(op, pos2):
                    left, _ = self.expr(pos + 1)
                    right, end = self.expr(pos2 + len(op))
                    if not s.startswith(")", end):
                        raise _ParseError
                    return (And(left, right) if op == " and " else Or(left, right)), end + 1
            for op in _OPS:
                if s.startswith(f" {op} ", pos2):
                    right_text, end = self._operand(pos2 + len(op) + 2)
                    if not s.startswith(")", end):
                        raise _ParseError
                    return self._comparison(left_text, op, right_text), end + 1
            raise _ParseError
        if s.startswith("invert(", pos):
            child, end = self.expr(pos + len("invert("))
            if not s.startswith(")", end):
                raise _ParseError
            return Not(child), end + 1
        if s.startswith("is_in(", pos):
            return self._is_in(pos)
        # Any other function call or bare token: skip it whole, as Unknown.
        text, end = self._operand(pos)
        return Unknown(text), end

    def _operand(self, pos: int) -> tuple[str, int]:
        """Raw text of one operand: a parenthesised group, a call, a string or a token."""
        s = self.s
        start = pos
        depth = 0
        in_str = False
        while pos < len(s):
            c = s[pos]
            if in_str:
                if c == "\\":
                    pos += 2
                    continue
                if c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and (s.startswith(" and ", pos) or s.startswith(" or ", pos)
                                 or any(s.startswith(f" {op} ", pos) for op in _OPS)):
                break
            pos += 1
        if in_str or pos == start:
            raise _ParseError
        return s[start:pos], pos

    def _comparison(self, left: str, op: str, right: str) -> Node:
        if left in self.schema.names and right not in self.schema.names:
            value = self._literal(right, self.schema.field(left).type)
            return Cmp(left, op, value) if value is not _BAD else Unknown(f"{left}{op}{right}")
        if right in self.schema.names and left not in self.schema.names:
            value = self._literal(left, self.schema.field(right).type)
            return Cmp(right, _FLIP[op], value) if value is not _BAD else Unknown(left)
        return Unknown(f"{left} {op} {right}")

    def _is_in(self, pos: int) -> tuple[Node, int]:
        text, end = self._operand(pos)  # the whole call, balanced
        inner = text[len("is_in("):-1] if text.endswith(")") else None
        if inner is None:
            raise _ParseError
        column, _, rest = inner.partition(", {value_set=")
        if column not in self.schema.names or not rest:
            return Unknown(text), end
        if pa.types.is_floating(self.schema.field(column).type):
            return Unknown(text), end  # is_in compares float bits (-0.0 is not 0.0): skip
        _, _, body = rest.partition(":[")
        body, _, _ = body.rpartition("]")
        items = [i.strip() for i in _split_items(body)]
        if any(i == "..." for i in items):
            return Unknown(text), end  # pyarrow elides large sets
        values = [self._literal(i, self.schema.field(column).type) for i in items if i]
        if any(v is _BAD for v in values):
            return Unknown(text), end
        return In(column, tuple(values)), end

    @staticmethod
    def _literal(text: str, typ: pa.DataType) -> Any:
        text = text.strip()
        if text == "null":
            return None
        try:
            if text.startswith('"') and text.endswith('"'):
                raw = text[1:-1].encode("utf-8").decode("unicode_escape").encode("latin-1")
                value: Any = raw.decode("utf-8")
                if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
                    return _BAD
                return value
            if pa.types.is_boolean(typ):
                return {"true": True, "false": False}.get(text, _BAD)
            if pa.types.is_integer(typ):
                return int(text)
            if pa.types.is_floating(typ):
                return float(text)
            if pa.types.is_temporal(typ):
                return pc.cast(pa.array([text]), typ)[0].as_py()
        except (ValueError, pa.ArrowException, UnicodeError):
            return _BAD
        return _BAD


_BAD = object()


def _split_items(body: str) -> list[str]:
    out, cur, in_str, i = [], [], False, 0
    while i < len(body):
        c = body[i]
        if in_str:
            cur.append(c)
            if c == "\\" and i + 1 < len(body):
                cur.append(body[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            cur.append(c)
        elif c == ",":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    if "".join(cur).strip():
        out.append("".join(cur))
    return out
