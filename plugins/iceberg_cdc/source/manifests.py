"""A manifest's entries with the v3 fields: kept here by name; the reader is pyiceberg internals.

:mod:`iceberg_cdc.pyiceberg_internals.manifest_reader` owns it (pyiceberg's
Avro reader with the v3 ``data_file`` schema, and the spec's inheritance
rules), so the Iceberg mirror's writers below the source layer can use it too.
"""

from iceberg_cdc.pyiceberg_internals.manifest_reader import manifest_entries, v3_field

__all__ = ["manifest_entries", "v3_field"]
