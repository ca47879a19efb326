"""Recovery of the metadata from the objects alone (``rebuild_from_objects``).

It sits above the format (it decodes index objects), the object store, the metadata store
(it writes rows) and the GC (it lists a store as the sweep does); snapshots, the usual way
back, are ``offloader/metadata/snapshot.py``.
"""

from offloader.recovery.rebuild import RebuildResult, rebuild_from_objects

__all__ = ["RebuildResult", "rebuild_from_objects"]
