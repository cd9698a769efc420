"""Query planning over MemWAL tables (source collection, region pruning, indexed reads).

The LSM-merging read planner arrives with the reads work (issue 3); writers do not depend on it.
"""
