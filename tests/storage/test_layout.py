from hypothesis import given
from hypothesis import strategies as st

from memwal_sql.storage import layout


def test_bitrev_matches_lance_names():
    # Lance 14 names WAL position 5 "101" + 61 zeros, and versions 1, 2, 3 "1000..", "0100..",
    # "1100.." (research/lance14-format.md §2).
    assert layout.bitrev64(5) == "101" + "0" * 61
    assert [layout.bitrev64(v)[:2] for v in (1, 2, 3)] == ["10", "01", "11"]
    assert layout.wal_entry_path("r", 1).endswith("/wal/1" + "0" * 63 + ".arrow")


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_bitrev_round_trips(n):
    assert layout.parse_bitrev64(layout.bitrev64(n) + ".binpb") == n


def test_generation_dir_names_are_fresh_and_parseable():
    a, b = layout.new_generation_dir_name(7), layout.new_generation_dir_name(7)
    assert a != b
    assert layout.parse_generation_dir_name(a) == 7
    assert layout.parse_generation_dir_name("manifest") is None
    assert layout.parse_generation_dir_name("zz_gen_1") is None


def test_wal_positions_are_one_based():
    import pytest

    with pytest.raises(ValueError):
        layout.wal_entry_path("r", 0)
