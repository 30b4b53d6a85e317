"""Storage: serdes, manifest, the format interface and the chain format, partitions, writer."""
