"""The binary data cache: a data set's rows as raw float32 arrays, reused while the data
are unchanged (app/data/cache/entry.py: :func:`prepare`). Below the input layer, above the
formats (docs/architecture.md, "Layers"). Never imports TensorFlow."""

from app.data.cache.entry import OWNER, PARTIAL, DataCache, Keep, prepare, source_key

__all__ = ["OWNER", "PARTIAL", "DataCache", "Keep", "prepare", "source_key"]
