"""The per-snapshot pipeline: plan, write, barrier, coalesce, read, commit, watermark, cleanup."""
