"""iqkit.store.partitions"""
