"""Everything memwal-sql relies on that its upstreams do not promise, in one place.

Each assumption has a test in ``tests/compat/``, so an upgrade of pylance, pyarrow or
datafusion that breaks one fails there, by name, rather than somewhere in a read:

* :mod:`.lance`: a private pylance call (``LanceDataset._take_rows``: rows by row address,
  which no public call does) and Lance's error messages, which are the only way to tell a
  missing dataset or a commit conflict from other failures (pylance raises plain
  ``OSError``/``ValueError``).
* :mod:`.lance` also reads an IVF_PQ index's PQ codebook from its ``auxiliary.idx`` (pylance
  reports the centroids but not the codebook; generations build their vector index with both).
* :mod:`.lance_fts`: Lance's full-text behaviour that full-text search over live data must
  reproduce: the stop words (measured) and the BM25 constants.
* :mod:`.lance_manifest`: Lance's manifest file layout, read directly because pylance's
  ``mem_wal_index_details()`` leaves out ``merged_generations``.
* :mod:`.arrow`: what pyarrow 26 writes into Substrait for a pushed filter (literal fields
  newer Substrait versions dropped; types it cannot convert).
* :mod:`.datafusion`: datafusion-python 55's quirks (view types in results; a schema
  provider's ``table_names`` read as an attribute; no dataset may have zero fragments).
"""
