"""Rewrites of offloaded data in place: compaction of small objects and migration between
the v1 ledger format and v2 streaming segments, each swapped in the metadata by CAS with
the old objects queued for deletion (readers never see a gap)."""
