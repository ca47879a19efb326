"""Garbage collection: the durable deletion queue (and, later, orphan sweeps)."""
