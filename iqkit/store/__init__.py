"""Storage: serdes, layout and manifest, RocksDB partitions, versions, layers, writer."""
