"""Rewriting offloaded objects (compaction, format migration): new objects, then a swap."""
