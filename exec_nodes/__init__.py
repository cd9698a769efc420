"""Physical operators over Arrow batches for MemWAL reads (DeduplicateExec, TakeLastExec, ...).

The operators arrive with the reads work (issue 3); writers do not depend on them.
"""
