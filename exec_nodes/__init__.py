"""Physical operators over Arrow batches for MemWAL reads (DeduplicateExec, the source leaves, ...).

The operators arrive with the reads work (issue 3); writers do not depend on them.
"""
