"""iqkit.store.chain"""
