"""The KV manager and its cache groups: which blocks and state rows each request holds, the prefix
cache's names for them, and pools that grow and shrink. Host-side block arithmetic only: the
pages themselves are the worker's (``stores/pages.py``)."""
