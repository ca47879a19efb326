"""Rewrites: compaction of small offloaded objects and format migration (v1 <-> v2).

``params`` is a run's parameters (one model for the CLI, the DAG form and the Spark
driver), ``plan`` the groups a run would rewrite, read from the metadata alone,
``encode`` the v1 sources re-encoded as one v2 segment, ``lease`` the keeper of a rewrite
segment's lease, ``run`` the state machine of one group (intent, upload, index, swap) and
of a run, ``report`` what a run did. The metadata side is metadata/rewrites.py.
"""
