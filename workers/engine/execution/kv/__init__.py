"""Key/value caches: the running batch's slab (`slab.py`), row surgery (`batch.py`), the prefix cache."""
