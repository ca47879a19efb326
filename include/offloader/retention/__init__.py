"""Retention (PDP-19): stream cuts, trims that move a topic's start, deletion of what falls
below it (invariant 4: move the start first, then delete through the queue)."""
