"""sql_operators never counts fewer operators than DataFusion's lexer sees: every way the
lexer lets a text hide a quote is tried before a chain of operators."""

from __future__ import annotations

import pytest

from memwal_sql.compat.datafusion import sql_operators

# Text that DataFusion reads as a literal, a quoted name or a comment holding a quote: a
# counter that took that quote for the start of a string would miss every operator after it.
HIDERS = {
    "escape string": "E'\\'' = ''",
    "lowercase escape string": "e'a\\'b' = ''",
    "backtick name": "`'` = 1",
    "dollar string": "$$'$$ = ''",
    "tagged dollar string": "$t$'$$ $t$ = ''",
    "nested comment": "/* /* */ ' */ 1 = 1",
    "comment after a symbol": "1 =/* ' */ 1",
    "line comment": "-- '\n1 = 1",
    "double-quoted name": '"\'" = 1',
    "doubled quotes": "'it''s' = ''",
}


@pytest.mark.parametrize("name", sorted(HIDERS))
def test_no_quote_hides_a_chain(name):
    chain = " OR ".join(f"v = {i}" for i in range(300))  # 599 operators
    text = f"{HIDERS[name]} OR {chain} OR s = 'x'"
    assert sql_operators(text) >= 599 + 3


def test_literals_names_comments_and_list_values_hold_no_operators():
    assert sql_operators("s = 'a OR b AND c' OR \"x = y\" = 1 -- OR OR") == 3
    assert sql_operators("id IN (-1, -2, +3) AND k NOT IN ('a-b', 'c+d')") == 2
    assert sql_operators("$$ OR $$ = /* OR /* OR */ OR */ 1") == 1
