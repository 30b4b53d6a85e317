"""iqkit.store.encoding"""
