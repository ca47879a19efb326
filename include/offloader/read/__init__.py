"""Reading entries back: from the object store (ranged GETs) or the hot tier."""
