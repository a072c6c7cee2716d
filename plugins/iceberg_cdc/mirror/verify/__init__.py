"""Verified mirrors: prove a mirror holds exactly its source's rows, and repair the keys that drifted.

:mod:`.digest` (row hashes, per-bucket digests), :mod:`.canonical` (one form
per value, whichever side read it), :mod:`.sides` (the readers), :mod:`.drift`
(which keys differ), :mod:`.repair` (rewrite them), :mod:`.check` (one
mirror, end to end), :mod:`.record` (the last verification, durably),
:mod:`.cli` (``make verify``).
"""
