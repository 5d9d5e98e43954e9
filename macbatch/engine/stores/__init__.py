"""The device arrays behind the cache groups, at the bottom of the engine's folders: the MLX
pages of the attention layers (``pages.py``: ``KVStore``, its layer shapes and page format) and
the recurrent layers' state rows (``state_store.py``: ``StateStore``). The adapter's layers read
and write them, the KV manager's groups size them, the disk tier copies them."""
