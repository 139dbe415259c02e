"""The broker core: a shard's partition owners (write path, flush, read path, producer state, retention)."""
