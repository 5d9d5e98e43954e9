"""The disk tier below the RAM prefix cache (docs/engine.md, "The disk tier"): the block files
(``files.py``), a model's namespace (``namespace.py``), the tier that writes and reads them off
the engine thread (``tier.py``), building one for an engine (``setup.py``), and what
``macbatch cache`` lists and clears (``listing.py``, no MLX)."""
