"""Columnar twins: every immutable SST of a chain has a Parquet file beside it holding the
same rows in the row layout (typed columns), so scans read columns in C and build no
database."""
