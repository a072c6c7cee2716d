"""The one door to pyiceberg's internals: private names, subclassed writers, re-implemented private steps.

pyiceberg 0.12 cannot write delete files, format-v3 metadata or manifests
whose ``equality_ids`` are typed as the spec says; the product needs all
three for its mirrors. Each module here covers one area, and each assumption
it makes about pyiceberg is pinned by a test in
``tests/unit/test_pyiceberg_internals_<area>.py``, so an upgrade that breaks
one fails there first, not in a commit.
"""
