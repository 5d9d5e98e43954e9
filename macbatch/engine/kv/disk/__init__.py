"""The disk tier below the RAM prefix cache (docs/engine.md, "The disk tier"): the block files
(``files.py``), a model's namespace (``namespace.py``), each cache group's part of a block
(``parts.py``), the tier that writes them off the engine thread (``tier.py``) and reads a waiting
request's prefix back (``reads.py``), building one for an engine (``setup.py``), its default
byte cap (``cap.py``, no MLX), and what ``macbatch cache`` lists and clears (``listing.py``,
no MLX)."""
