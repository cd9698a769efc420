"""Maintained indexes: what each flushed generation builds beside its rows (spec, "MemTable
indexing" and "Vector Index Configuration").

The MemWAL index names the base-table indexes writers maintain (``maintained_indexes``, or every
index when ``maintain_all_indexes`` is set, as Lance 14's ``initialize_mem_wal`` writes it by
default). A generation gets each of them under the same name, built so that its answers are
comparable with the base table's:

* a vector index with the base index's IVF centroids and, for IVF_PQ, its PQ codebook (the spec:
  distances must be comparable across the LSM tree, and the centroids decide recall);
* an inverted index with the base index's tokenizer parameters (same terms);
* a scalar index of the same type.

Example:
    ``[i.name for i in maintained_indexes(tbl.dataset(), tbl.mem_wal_details())]``
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import lance
import numpy as np

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails
from memwal_sql.compat.lance import ivf_pq_model
from memwal_sql.formats.lance_manifest import INDEX_NAME

# Tokenizer parameters of an inverted index that create_scalar_index takes back.
_INVERTED_PARAMS = (
    "base_tokenizer",
    "language",
    "with_position",
    "max_token_length",
    "lower_case",
    "stem",
    "remove_stop_words",
    "ascii_folding",
    "min_ngram_length",
    "max_ngram_length",
    "prefix_only",
)


@dataclass(frozen=True)
class MaintainedIndex:
    """One index to build on each flushed generation: ``create_index`` (vector) or
    ``create_scalar_index`` of ``index_type`` on ``column`` with ``params``."""

    name: str
    column: str
    index_type: str
    vector: bool
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def build(self, dataset: lance.LanceDataset) -> lance.LanceDataset:
        """Build the index on a generation's dataset (a new version of it)."""
        if self.vector:
            dataset.create_index(self.column, self.index_type, name=self.name, **self.params)
        else:
            # index_type is as lance's index statistics report it (a str); lance types the
            # same names as a Literal here.
            dataset.create_scalar_index(
                self.column,
                self.index_type,  # type: ignore[arg-type]
                name=self.name,
                **self.params,
            )
        return dataset


def maintained_indexes(
    dataset: lance.LanceDataset,
    details: MemWalIndexDetails,
    storage_options: dict[str, str] | None = None,
) -> list[MaintainedIndex]:
    """The base table's indexes writers maintain, with what a generation needs to build each."""
    wanted = None if details.maintain_all_indexes else set(details.maintained_indexes)
    if wanted is not None and not wanted:
        return []
    out = []
    for d in dataset.describe_indices():
        if d.name == INDEX_NAME or (wanted is not None and d.name not in wanted):
            continue
        if len(d.field_names) != 1:
            continue
        stats = dataset.index_statistics(d.name)
        stats = json.loads(stats) if isinstance(stats, str) else stats
        first = (stats.get("indices") or [{}])[0]
        kind = str(stats.get("index_type", ""))
        column = d.field_names[0]
        if "Vector" in d.type_url:
            centroids = np.asarray(first.get("centroids") or [], dtype=np.float32)
            params: dict[str, Any] = {
                "metric": str(first.get("metric_type", "l2")),
                "num_partitions": len(centroids),
                "ivf_centroids": centroids,
            }
            if kind == "IVF_PQ":
                # The statistics' "uri" is a path without the store's scheme and bucket.
                index_dir = f"{dataset.uri.rstrip('/')}/_indices/{first['uuid']}"
                codebook, _ = ivf_pq_model(f"{index_dir}/index.idx", storage_options)
                params.update(pq_codebook=codebook, num_sub_vectors=codebook.shape[0])
            out.append(MaintainedIndex(d.name, column, kind, True, params))
        elif "Inverted" in d.type_url:
            params = {k: v for k, v in (first.get("params") or {}).items() if k in _INVERTED_PARAMS}
            out.append(MaintainedIndex(d.name, column, "INVERTED", False, params))
        elif kind.upper() in ("BTREE", "BITMAP", "LABEL_LIST"):
            out.append(MaintainedIndex(d.name, column, kind.upper(), False))
    return out


__all__ = ["MaintainedIndex", "maintained_indexes"]
