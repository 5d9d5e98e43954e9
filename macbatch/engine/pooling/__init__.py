"""Pooling requests: the pooling methods and how a checkpoint pools (embeddings, reranking)."""
