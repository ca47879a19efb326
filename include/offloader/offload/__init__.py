"""Moving sealed ledgers to the object store (PIP-17) and removing hot copies afterwards."""
