"""A writer process for the crash tests: writes batches and prints each acknowledged one.

Usage: python -m tests.writer.crash_child URI MODE [STORAGE_OPTIONS_JSON]
MODE "puts": durable upserts/deletes forever. MODE "flush": like "puts", but every MemTable flush
prints FLUSHING and then stalls inside the generation write, so the parent can kill it there.
MODE "flushes": like "puts" with small MemTables, flushed one after another while the writes go
on; each flush prints FLUSHING midway through its generation write (between the data files and
the ``_pk_index``) and carries on, so generations keep being committed until the kill.
MODE "claim": claims the table's region as a writer whose sentinel leaps two positions ahead of
the WAL (as against a writer appending flat out), prints SENTINEL once it is put and stalls
there: before the claim fills the positions leapt over, syncs and records its sentinel.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import memwal_sql as mw
from tests.writer.crash_plan import batch_for

_STDOUT = threading.Lock()


def emit(line: str) -> None:
    """One whole line per write: the flush thread and the main thread both report."""
    with _STDOUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> None:
    uri, mode = sys.argv[1], sys.argv[2]
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    if mode == "flush":
        from memwal_sql.writer import flush

        real = flush.write_pk_index

        def stalling(uri_, keys, opts=None):
            real(uri_, keys, opts)
            emit("FLUSHING")
            time.sleep(3600)

        flush.write_pk_index = stalling
    elif mode == "flushes":
        from memwal_sql.writer import flush

        real = flush.write_pk_index

        def reporting(uri_, keys, opts=None):
            emit("FLUSHING")
            real(uri_, keys, opts)

        flush.write_pk_index = reporting
    elif mode == "claim":
        from memwal_sql.writer.region_writer import RegionWriter

        free, put = RegionWriter._free_position, RegionWriter._put_sentinel

        def leaping(self, position):
            return free(self, position) + 2

        def stalling(self, position):
            if put(self, position):
                emit("SENTINEL")
                time.sleep(3600)
            return False

        RegionWriter._free_position = leaping
        RegionWriter._put_sentinel = stalling
        tbl = mw.open_table(uri, options)
        tbl.writer(region_id=tbl.regions()[0])
    tbl = mw.open_table(uri, options)
    w = tbl.writer(max_memtable_rows={"flush": 400, "flushes": 120}.get(mode, 1_000_000))
    emit("READY")
    i = 0
    while True:
        kind, data = batch_for(i)
        if kind == "upsert":
            w.upsert(data)
        else:
            w.delete(data)
        emit(f"ACK {i}")
        i += 1


if __name__ == "__main__":
    main()
