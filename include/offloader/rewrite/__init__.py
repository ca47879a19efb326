"""Rewriting offloaded objects (compaction, format migration): new objects, then a swap.

``params`` is a run's parameters (one model for the CLI, the DAG form and the Spark
driver), ``plan`` the groups a run would rewrite, read from the metadata alone,
``encode`` v1 sources re-encoded as one v2 segment, ``merge`` (with ``merge_plan`` and
``merge_parts``) adjacent segments merged, server side where the store allows it,
``lease`` the keeper of a rewrite segment's lease, ``run`` the state machine of one group
(intent, upload, index, swap) and of a run, ``report`` what a run did, ``to_v1`` the
migration of streamed ledgers back to v1 objects. The metadata side of the swap is
metadata/rewrites.py.
"""
