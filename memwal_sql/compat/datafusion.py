"""datafusion-python 55 quirks memwal-sql works around.

* Results may hold ``string_view``/``binary_view`` columns (DataFusion's own scans produce
  them); pandas and Spark want plain ``string``/``binary`` (:func:`plain_strings`).
* A ``SchemaProvider``'s ``table_names`` is read as an attribute and must be a list (a
  method is ignored and hides the tables from ``SHOW TABLES``): see
  :class:`memwal_sql.session.MemWalSchema`.
* A pyarrow dataset must never return zero fragments: ``UnknownPartitioning(0)`` breaks
  ``ORDER BY`` plans (``SanityCheckPlan``). Our scan plan always has partition 0.
* A pushed filter is *Exact*: DataFusion never re-checks it, and it pushes SQL ``NOT IN`` as
  pyarrow's ``~is_in``, which is true for NULL; :mod:`memwal_sql.expressions.predicate` evaluates it with
  SQL semantics instead.
* Its SQL parser nests a chain of binary operators (``a OR b OR ...``, ``a + b + ...``) one
  level per operator and walks it recursively: about 9,000 of them overflow an 8 MB thread
  stack and kill the process (SIGSEGV), and planning one takes time quadratic in its length
  (``benchmarks/bench_inputs.py`` measures it up to the bound). Nesting (parentheses, ``NOT``,
  function calls) is already bounded by its parser (50 levels). :func:`sql_operators` counts
  the operators of a text before DataFusion sees it.
* A physical plan that is our dataset's scan alone reads ``CooperativeExec`` over
  ``DatasetExec`` (:func:`scan_only`); a filter it folds to false plans ``EmptyExec``.
* It never pushes ``LIKE`` into a pyarrow dataset, and its Python ``Like`` expression does
  not say whether it is ``ILIKE``: only its canonical name does (:func:`plain_likes`).
* A statement that does not parse or plan is a plain ``ValueError`` whose text is all there
  is: a parser error ends in ``at Line: L, Column: C``; a planning error names what it could
  not resolve but not where. :func:`sql_error` reads both into a
  :class:`~memwal_sql.errors.SqlError`.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from memwal_sql.errors import InvalidInputError, SqlError

#: The most operators a filter or a SQL statement may hold: far below where DataFusion's
#: parser overflows its stack (about 9,000), and where its quadratic planning stays short
#: (``benchmarks/bench_inputs.py``, docs/performance.md). Lucene's default limit of clauses in
#: a query is the same.
MAX_SQL_OPERATORS = 1024

# SQL text as DataFusion (sqlparser's generic dialect) lexes it, as far as operators go:
# literals, quoted names and comments hold none. Every way its lexer lets a text hide a quote is
# here (E'\'' escape strings, `backtick` names, $tag$ dollar strings, nested /* */
# comments): one missed would let a quote start a "string" that hides the operators after it.
# A symbol run stops before a comment, as the lexer's does.
_SQL_TOKENS = re.compile(
    r"(?P<skip>[eE]'(?:[^'\\]|\\.|'')*'?"  # an escape string: backslash escapes, '' too
    r"|'(?:[^']|'')*'?"  # a string literal ('' inside), unterminated to the end
    r'|"(?:[^"]|"")*"?'  # a quoted name
    r"|`(?:[^`]|``)*`?"  # a quoted name, MySQL's way
    r"|--[^\n]*)"  # a line comment
    r"|(?P<comment>/\*)"  # a block comment, nested ones inside
    r"|(?P<dollar>\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$)"  # a dollar-quoted string: $$..$$, $t$..$t$
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_$]*)"
    r"|(?P<symbol>(?:(?!/\*|--)[-+*/%<>=!|&^~@#:])+)",
    re.DOTALL,
)
_COMMENT_ENDS = re.compile(r"/\*|\*/")
_OPERATOR_WORDS = frozenset({"AND", "OR", "NOT", "IS", "LIKE", "ILIKE", "SIMILAR", "BETWEEN"})


def sql_operators(text: str) -> int:
    """How many operators ``text`` holds outside its literals and comments: each run of
    operator symbols (``=``, ``<>``, ``+``, ``||`` ...) and each ``AND``, ``OR``, ``NOT``,
    ``IS``, ``LIKE``, ``ILIKE``, ``SIMILAR``, ``BETWEEN``. An ``IN`` list's values are not
    operators, nor their signs.

    Example:
        >>> sql_operators("a = 1 OR b IN (1, -2) OR c LIKE 'x OR y' -- AND")
        4
        >>> sql_operators("E'\\'' = '' /* /* */ ' */ OR a = `'` OR $$'$$ = b")
        5
    """
    count, at = 0, 0
    while (m := _SQL_TOKENS.search(text, at)) is not None:
        at = m.end()
        if m.group("comment"):
            depth = 1
            while depth and (end := _COMMENT_ENDS.search(text, at)) is not None:
                depth += 1 if end.group() == "/*" else -1
                at = end.end()
            if depth:
                return count  # unterminated: the rest is comment
        elif m.group("dollar"):
            close = text.find(m.group("dollar"), at)
            if close < 0:
                return count  # unterminated: the rest is the string
            at = close + len(m.group("dollar"))
        elif m.group("symbol") in ("-", "+") and _after_list_start(text, m.start()):
            continue  # a sign of a list's value (IN (-1, -2)): no chain
        elif m.group("symbol") or (m.group("word") or "").upper() in _OPERATOR_WORDS:
            count += 1
    return count


def refuse_long_sql(text: str, what: str, error: type[InvalidInputError]) -> None:
    """Raise ``error`` if ``text`` holds more than :data:`MAX_SQL_OPERATORS` operators.

    Example:
        >>> refuse_long_sql("a = 1", "the filter", InvalidInputError)
    """
    operators = sql_operators(text)
    if operators > MAX_SQL_OPERATORS:
        raise error(
            f"{what} holds {operators} operators, above the limit of {MAX_SQL_OPERATORS} "
            "(DataFusion's parser fails on long chains of them); write a long OR of "
            "equalities as an IN list, which holds any number of values"
        )


def _after_list_start(text: str, at: int) -> bool:
    """Whether the last character before ``at`` that is not white space is ``(`` or ``,``."""
    at -= 1
    while at >= 0 and text[at].isspace():
        at -= 1
    return at >= 0 and text[at] in "(,"


def plain_strings(table: pa.Table) -> pa.Table:
    """``table`` with view types cast back to plain string/binary.

    Example:
        >>> plain_strings(pa.table({"s": pa.array(["a"], pa.string_view())})).schema.field("s").type
        DataType(string)
    """
    fields = []
    changed = False
    for f in table.schema:
        if pa.types.is_string_view(f.type):
            f, changed = f.with_type(pa.string()), True
        elif pa.types.is_binary_view(f.type):
            f, changed = f.with_type(pa.binary()), True
        fields.append(f)
    return table.cast(pa.schema(fields, metadata=table.schema.metadata)) if changed else table


_SCAN_OPERATORS = frozenset({"CooperativeExec", "DatasetExec"})


def scan_only(plan: str) -> bool:
    """Whether a physical plan (``display_indent()``) is a pyarrow dataset's scan and nothing
    else: DataFusion does nothing to the rows the dataset yields.

    Example:
        >>> scan_only("CooperativeExec\\n  DatasetExec: number_of_fragments=2, projection=[k]\\n")
        True
    """
    operators = {line.strip().split(":")[0] for line in plan.splitlines() if line.strip()}
    return "DatasetExec" in operators and operators <= _SCAN_OPERATORS


def plain_likes(expr: Any) -> tuple[list[Any], list[tuple[str, str, bool]]]:
    """A parsed filter split at its top-level ``AND``: the conjuncts that are not a plain
    ``LIKE``, and the plain ones as ``(column, pattern, negated)``: ``column [NOT] LIKE
    'pattern'``, case-sensitive, without ``ESCAPE`` or a backslash in the pattern (whose
    meaning DataFusion's kernel and Arrow's ``match_like`` might not share).

    Example:
        ``plain_likes(df.parse_sql_expr("x = 1 AND s LIKE 'g%'"))`` -> ``([x = 1], [("s", "g%", False)])``
    """
    rest: list[Any] = []
    likes: list[tuple[str, str, bool]] = []
    stack = [expr]
    while stack:
        e = stack.pop()
        kind = e.variant_name()
        if kind == "BinaryExpr" and e.rex_call_operator() == "AND":
            stack.extend(reversed(e.rex_call_operands()))
            continue
        like = _plain_like(e) if kind == "Like" else None
        if like is None:
            rest.append(e)
        else:
            likes.append(like)
    return rest, likes


def _plain_like(e: Any) -> tuple[str, str, bool] | None:
    v = e.to_variant()
    column, pattern = v.expr(), v.pattern()
    if v.escape_char() is not None or column.variant_name() != "Column":
        return None
    if pattern.variant_name() != "Literal":
        return None
    try:
        text = pattern.to_variant().value_string()
    except Exception:  # a NULL pattern
        return None
    if not isinstance(text, str) or "\\" in text or '"' in text:
        return None
    # The canonical name is the only place ILIKE shows: it must read as a plain LIKE.
    negated = bool(v.negated())
    want = f'{column.canonical_name()} {"NOT " if negated else ""}LIKE Utf8("{text}")'
    if e.canonical_name() != want:
        return None
    return column.to_variant().name(), text, negated


# DataFusion's error texts for a statement that does not parse or plan (its DataFusionError
# variants SQL, Plan, SchemaError, NotImplemented), as datafusion-python words them.
_PARSE = re.compile(r'^SQL error: ParserError\("(.*)"\)$', re.S)
_PLAN_PREFIXES = (
    "Error during planning: ",
    "Schema error: ",
    "SQL error: ",
    "This feature is not implemented: ",
)
_AT = re.compile(r"\s*at Line: (\d+), Column: (\d+)\s*$")
# What a planning error names: table 'memwal.public.t', function 'f', field named x.
_NAMED = re.compile(
    r"(?:table|function|column|field) '(?:[^'.]*\.)*([^'.]+)'|field named \"?(?:\w+\.)*(\w+)\"?"
)


def sql_error(error: Exception, statement: str) -> SqlError | None:
    """DataFusion's failure to parse or plan ``statement`` as a :class:`SqlError` with the
    line and column (1-based) it points at, or ``None`` for any other failure.

    Example:
        >>> e = sql_error(ValueError('SQL error: ParserError("Expected: an SQL statement, '
        ...     'found: SELEC at Line: 1, Column: 1")'), "SELEC 1")
        >>> e.line, e.column, str(e)
        (1, 1, "SQL syntax error at line 1, column 1 (near 'SELEC 1'): Expected: an SQL statement, found: SELEC")
    """
    text = str(error).removeprefix("DataFusion error: ").strip()
    parsed = _PARSE.match(text)
    if parsed is not None:
        kind, detail = "SQL syntax error", parsed.group(1)
    else:
        prefix = next((p for p in _PLAN_PREFIXES if text.startswith(p)), None)
        if prefix is None:
            return None
        kind, detail = "SQL error", text.removeprefix(prefix)
    line = column = None
    at = _AT.search(detail)
    if at is not None:
        line, column = int(at.group(1)), int(at.group(2))
        detail = detail[: at.start()]
    elif detail.endswith("found: EOF"):  # the statement ended early: point past its end
        lines = statement.rstrip().splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
    else:
        named = _NAMED.search(detail)
        if named is not None:
            line, column = _position(statement, named.group(1) or named.group(2))
    detail = " ".join(detail.split())
    where = ""
    if line is not None and column is not None:
        lines = statement.splitlines() or [""]
        near = lines[line - 1][column - 1 : column + 29].strip() if line <= len(lines) else ""
        where = f" at line {line}, column {column}" + (f" (near {near!r})" if near else "")
    return SqlError(f"{kind}{where}: {detail}", statement=statement, line=line, column=column)


def _position(statement: str, name: str) -> tuple[int | None, int | None]:
    """The line and column (1-based) of the first whole-word ``name`` in ``statement``."""
    found = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", statement, re.I)
    if found is None:
        return None, None
    before = statement[: found.start()]
    return before.count("\n") + 1, found.start() - (before.rfind("\n") + 1) + 1
