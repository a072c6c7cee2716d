"""The two-phase hash shuffle: map outputs on an object store, read by partition range."""
