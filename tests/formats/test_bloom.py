"""bloom_filter.bin: our vectorised SipHash/SBBF against Lance 14's own files and a scalar reference.

Ground truth comes from pylance 14: a table with an unenforced primary key, one MemWAL shard
writer, puts (with repeated keys), deletes, close (which flushes generation 1). Lance inserts
into ``bloom_filter.bin`` the key of **every physical row** of the generation: each put row,
including rows a later duplicate supersedes (masked by the deletion vector), and every
``_tombstone`` row written by ``delete`` (even for keys never put). So the filter equals
``bloom_filter_bytes(pk_hashes(<PK columns of the raw data file>))``.
"""

from __future__ import annotations

import glob
import os
import struct
import uuid

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lance.file import LanceFileReader

from memwal_sql.errors import InvalidInputError, SchemaMismatchError, StorageError
from memwal_sql.formats import bloom
from memwal_sql.formats.bloom import (
    LANCE_BLOOM_BYTES,
    BloomFilter,
    bloom_filter_bytes,
    optimal_num_bytes,
    pk_hashes,
    siphash13,
)

PK = {"lance-schema:unenforced-primary-key": "true"}

# ------------------------------------------------------------------------------------------
# Ground truth from Lance
# ------------------------------------------------------------------------------------------


def lance_generation(root: str, schema: pa.Schema, ops: list[tuple[str, pa.Table]]) -> str:
    """Apply ("put" | "delete", table) ops through Lance's MemWAL writer; return the gen dir.

    The dataset starts empty; ``close()`` flushes everything into one generation.
    """
    uri = os.path.join(root, "t")
    ds = lance.write_dataset(schema.empty_table(), uri)
    ds.initialize_mem_wal()
    writer = ds.mem_wal_writer(str(uuid.uuid4()))
    for op, table in ops:
        writer.put(table) if op == "put" else writer.delete(table)
    writer.close()
    gens = glob.glob(os.path.join(uri, "_mem_wal", "*", "*_gen_1"))
    assert len(gens) == 1, gens
    return gens[0]


def physical_rows(gen_dir: str) -> pa.Table:
    """Every physical row of the generation's single data file, deletion vector NOT applied."""
    files = glob.glob(os.path.join(gen_dir, "data", "*.lance"))
    assert len(files) == 1, files
    assert len(lance.dataset(gen_dir).get_fragments()) == 1
    return LanceFileReader(files[0]).read_all().to_table()


def pk_schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    """Schema with the given PK columns (in order) plus a nullable payload column."""
    return pa.schema(
        [pa.field(n, t, False, metadata=PK) for n, t in fields] + [pa.field("payload", pa.utf8())]
    )


def _strings(rng: np.random.Generator, n: int) -> list[str]:
    """n strings of 0..20 characters, ASCII, multi-byte (2-4 byte UTF-8) and embedded NULs."""
    alphabet = [*list("abcxyz019 -_"), "é", "ß", "日", "本", "€", "😀", "\x00", "\x7f"]
    lens = rng.integers(0, 21, n)
    picks = rng.integers(0, len(alphabet), int(lens.sum()))
    out, at = [], 0
    for ln in lens:
        out.append("".join(alphabet[i] for i in picks[at : at + ln]))
        at += ln
    return out


def key_columns(kind: str, rng: np.random.Generator, n: int) -> dict[str, pa.Array]:
    """Random PK columns for one of the tested key kinds."""
    if kind == "int64":
        return {"id": pa.array(rng.integers(-(2**62), 2**62, n), pa.int64())}
    if kind == "int32":
        return {"id": pa.array(rng.integers(-(2**31), 2**31 - 1, n), pa.int32())}
    if kind == "utf8":
        return {"id": pa.array(_strings(rng, n), pa.utf8())}
    if kind == "composite":
        return {
            "a": pa.array(rng.integers(-50, 50, n), pa.int64()),
            "b": pa.array(_strings(rng, n), pa.utf8()),
        }
    raise AssertionError(kind)


KIND_FIELDS = {
    "int64": [("id", pa.int64())],
    "int32": [("id", pa.int32())],
    "utf8": [("id", pa.utf8())],
    "composite": [("a", pa.int64()), ("b", pa.utf8())],
}


def build_lance_generation(root: str, kind: str, n: int, seed: int = 0) -> tuple[str, list[str]]:
    """A Lance generation of ~n + n/4 physical rows of ``kind`` keys with dups and deletes.

    Returns (gen_dir, primary-key column names).
    """
    rng = np.random.default_rng(seed)
    schema = pk_schema(*KIND_FIELDS[kind])
    names = [f for f, _ in KIND_FIELDS[kind]]
    keys = key_columns(kind, rng, n)
    payload = pa.array([None if i % 3 == 0 else f"p{i}" for i in range(n)], pa.utf8())
    first = pa.table({**keys, "payload": payload}, schema=schema)
    # Re-put a quarter of the keys (duplicates inside the generation), then delete some of
    # them plus keys that were never put (tombstones only).
    again = first.take(rng.choice(n, n // 4, replace=False))
    absent = key_columns(kind, np.random.default_rng(seed + 1000), 50)
    gone = pa.concat_tables(
        [
            first.select(names).slice(0, 100),
            pa.table(absent, schema=pa.schema([schema.field(c) for c in names])),
        ]
    )
    ops = [
        ("put", first.slice(0, n // 2)),
        ("put", first.slice(n // 2)),
        ("put", again),
        ("delete", gone),
    ]
    return lance_generation(root, schema, ops), names


# ------------------------------------------------------------------------------------------
# The scalar reference (research notes §8), only ever used to check the vectorised code
# ------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M64


def siphash13_ref(data: bytes) -> int:
    v0, v1, v2, v3 = 0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573

    def rnd(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
        v0 = (v0 + v1) & _M64
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & _M64
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & _M64
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & _M64
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
        return v0, v1, v2, v3

    n = len(data)
    end = n - n % 8
    for i in range(0, end, 8):
        m = struct.unpack_from("<Q", data, i)[0]
        v3 ^= m
        v0, v1, v2, v3 = rnd(v0, v1, v2, v3)
        v0 ^= m
    b = (n & 0xFF) << 56
    for i, c in enumerate(data[end:]):
        b |= c << (8 * i)
    v3 ^= b
    v0, v1, v2, v3 = rnd(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = rnd(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def pk_hash_ref(row: list[tuple[pa.DataType, object]]) -> int:
    out = b""
    for t, v in row:
        if v is None:
            out += b"\x01"
            continue
        out += b"\x00"
        if t == pa.int32():
            out += struct.pack("<i", v)
        elif t == pa.int64():
            out += struct.pack("<q", v)
        elif t == pa.utf8():
            out += v.encode() + b"\xff"
        elif t == pa.binary():
            out += struct.pack("<Q", len(v)) + v
    return siphash13_ref(out)


def pk_hashes_ref(table: pa.Table) -> list[int]:
    types = table.schema.types
    return [pk_hash_ref(list(zip(types, row.values()))) for row in table.to_pylist()]


SALT = [
    0x47B6137B,
    0x44974D91,
    0x8824AD5B,
    0xA2B7289D,
    0x705495C7,
    0x2DF1424B,
    0x9EFC4947,
    0x5C6BFB31,
]


def sbbf_ref(hashes: list[int], nbytes: int) -> bytes:
    words = [0] * (nbytes // 4)
    nblocks = nbytes // 32
    for h in hashes:
        blk = ((h >> 32) * nblocks) >> 32
        x = h & 0xFFFFFFFF
        for i, s in enumerate(SALT):
            words[blk * 8 + i] |= 1 << (((x * s) & 0xFFFFFFFF) >> 27)
    return struct.pack(f"<{len(words)}I", *words)


# ------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["int64", "int32", "utf8", "composite"])
def lance_gen(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[str]]:
    return build_lance_generation(str(tmp_path_factory.mktemp(request.param)), request.param, 3000)


def test_siphash_known_vectors() -> None:
    assert siphash13(b"") == 0xD1FBA762150C532C
    # Every tail length, several full-word counts, and lengths >= 256 (only len % 256 is mixed in).
    for n in [*range(70), 127, 128, 255, 256, 257, 300, 1000]:
        data = bytes((7 * i + n) & 0xFF for i in range(n))
        assert siphash13(data) == siphash13_ref(data), n


@pytest.mark.interop
def test_bloom_matches_lance_bytes(lance_gen: tuple[str, list[str]]) -> None:
    gen_dir, names = lance_gen
    rows = physical_rows(gen_dir)
    assert pc.any(rows.column("_tombstone")).as_py()  # tombstones are in the gen ...
    with open(os.path.join(gen_dir, "bloom_filter.bin"), "rb") as f:
        lance_bytes = f.read()
    assert len(lance_bytes) == LANCE_BLOOM_BYTES
    hashes = pk_hashes(rows.select(names))
    assert bloom_filter_bytes(hashes) == lance_bytes
    # ... and really inserted: dropping the tombstone-only keys changes the filter.
    live = rows.filter(pc.invert(rows.column("_tombstone")))
    assert bloom_filter_bytes(pk_hashes(live.select(names))) != lance_bytes
    # The scalar reference agrees on a sample (it is slow).
    sample = rows.select(names).slice(0, 300)
    assert [int(h) for h in pk_hashes(sample)] == pk_hashes_ref(sample)


@pytest.mark.interop
def test_might_contain(lance_gen: tuple[str, list[str]]) -> None:
    gen_dir, names = lance_gen
    with open(os.path.join(gen_dir, "bloom_filter.bin"), "rb") as f:
        bf = BloomFilter.from_bytes(f.read())
    assert bf.num_bytes == LANCE_BLOOM_BYTES
    present = pk_hashes(physical_rows(gen_dir).select(names))
    assert bf.might_contain(present).all()
    absent = np.random.default_rng(7).integers(0, 2**64 - 1, 20000, dtype=np.uint64, endpoint=True)
    absent = absent[~np.isin(absent, present)]
    # ~4k keys in a filter sized for 8192 at fpp 0.00057: a few false positives at most.
    assert bf.might_contain(absent).mean() < 0.01
    assert BloomFilter.from_bytes(bf.to_bytes()).to_bytes() == bf.to_bytes()


@pytest.mark.interop
@pytest.mark.parametrize(
    "pk_type, values",
    [
        (pa.int8(), [1, -2, 3, 1]),
        (pa.uint64(), [1, 2, 2**63 + 5]),
        (pa.bool_(), [True, False]),
        (pa.large_utf8(), ["a", "bb", ""]),
        (pa.binary(), [b"", b"a\x00", b"xyz" * 7]),
        (pa.large_binary(), [b"a", b""]),
    ],
)
def test_bloom_other_pk_types_match_lance(
    tmp_path: str, pk_type: pa.DataType, values: list
) -> None:
    """Lance hashes only int32/int64/utf8/binary values; the other PK types hash the flag only."""
    schema = pk_schema(("id", pk_type))
    table = pa.table(
        {"id": pa.array(values, pk_type), "payload": [None] * len(values)}, schema=schema
    )
    gen_dir = lance_generation(str(tmp_path), schema, [("put", table)])
    with open(os.path.join(gen_dir, "bloom_filter.bin"), "rb") as f:
        assert bloom_filter_bytes(pk_hashes(physical_rows(gen_dir).select(["id"]))) == f.read()


@pytest.mark.parametrize(
    "pk_type", [pa.timestamp("us"), pa.float64(), pa.date32(), pa.string_view()]
)
def test_unsupported_pk_types_rejected(pk_type: pa.DataType) -> None:
    with pytest.raises(SchemaMismatchError):
        pk_hashes(pa.table({"k": pa.array([], pk_type)}))


_ROW = st.fixed_dictionaries(
    {
        "i32": st.none() | st.integers(-(2**31), 2**31 - 1),
        "i64": st.none() | st.integers(-(2**63), 2**63 - 1),
        "s": st.none() | st.text(max_size=40),
        "b": st.none() | st.binary(max_size=40),
    }
)
_TYPES = {"i32": pa.int32(), "i64": pa.int64(), "s": pa.utf8(), "b": pa.binary()}


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(_ROW, max_size=40),
    columns=st.lists(st.sampled_from(sorted(_TYPES)), min_size=1, max_size=3),
    cut=st.integers(0, 40),
)
def test_pk_hashes_matches_reference(rows: list[dict], columns: list[str], cut: int) -> None:
    names = [f"{c}{i}" for i, c in enumerate(columns)]
    table = pa.table({n: pa.array([r[c] for r in rows], _TYPES[c]) for n, c in zip(names, columns)})
    # Two chunks, the second a slice with a non-zero offset, to exercise buffer offsets.
    chunked = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    expected = pk_hashes_ref(table)
    assert [int(h) for h in pk_hashes(chunked)] == expected
    batch = pa.RecordBatch.from_arrays([c.combine_chunks() for c in chunked.columns], names=names)
    assert [int(h) for h in pk_hashes(batch)] == expected
    assert bloom_filter_bytes(pk_hashes(table), 64) == sbbf_ref(expected, 64)


@pytest.mark.parametrize("chunk", [1000, bloom._SET_BITS_CHUNK])
def test_bloom_filter_bytes_matches_reference_and_validates(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bloom, "_SET_BITS_CHUNK", chunk)  # 1000: hashes set in 5 chunks
    hashes = np.random.default_rng(3).integers(0, 2**64 - 1, 5000, dtype=np.uint64, endpoint=True)
    for nbytes in (32, 1024, LANCE_BLOOM_BYTES):
        assert bloom_filter_bytes(hashes, nbytes) == sbbf_ref([int(h) for h in hashes], nbytes)
    assert bloom_filter_bytes(np.empty(0, np.uint64)) == bytes(LANCE_BLOOM_BYTES)
    bf = BloomFilter(1024)
    bf.insert(hashes[:2500])
    bf.insert(hashes[2500:])
    assert bf.to_bytes() == bloom_filter_bytes(hashes, 1024)
    assert BloomFilter.from_hashes(hashes, 1024).to_bytes() == bf.to_bytes()
    for bad in (b"", bytes(31), bytes(48)):
        with pytest.raises(StorageError, match="multiple of 32"):
            BloomFilter.from_bytes(bad)
    with pytest.raises(InvalidInputError):
        bloom_filter_bytes(hashes, 100)


def test_optimal_num_bytes() -> None:
    assert optimal_num_bytes(8192, 0.00057) == LANCE_BLOOM_BYTES
    # Parquet/Lance: bits = -8 ndv / ln(1 - fpp^(1/8)); e.g. (1000, 0.01) -> 9681 bits -> 1210 B
    assert optimal_num_bytes(1000, 0.01) == 2048
    assert optimal_num_bytes(0, 0.5) == 32
    assert optimal_num_bytes(10**12, 0.001) == 128 * 1024 * 1024
    with pytest.raises(InvalidInputError):
        optimal_num_bytes(10, 1.5)


def test_pk_hashes_on_a_large_batch_matches_the_reference() -> None:
    """Chunked vectorised hashing of a million keys agrees with the reference on a sample."""
    n = 1_000_000
    table = pa.table({"id": pa.array(np.arange(n, dtype=np.int64) * 7919)})
    hashes = pk_hashes(table)
    for start in (0, 123_456, n - 50):
        sample = table.slice(start, 50)
        assert [int(h) for h in hashes[start : start + 50]] == pk_hashes_ref(sample)
