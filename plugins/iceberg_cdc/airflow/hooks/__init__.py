"""Hooks: :class:`~.cdc.CdcHook` owns every connection and credential of the pipeline."""
