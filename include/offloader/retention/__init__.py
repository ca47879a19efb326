"""Retention (PDP-19): stream cuts, trim, policies, deletion across tiers."""
