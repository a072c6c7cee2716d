"""Per-key change computation: carryover removal and update merge."""
