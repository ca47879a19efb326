"""Streaming offload (PIP-76): segments that span ledgers, rolled over by size or time."""
