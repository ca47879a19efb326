"""Shared fixtures: real SeaweedFS, real PostgreSQL, real SQLite (see tests/fixtures/)."""

pytest_plugins = ["fixtures.seaweedfs", "fixtures.databases", "fixtures.backends"]
