"""Mirrors: tables kept exactly equal to a source, fed by its changelog."""
