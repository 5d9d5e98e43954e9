"""Encoder-only (bidirectional) embedding and cross-encoder models: BERT, RoBERTa, XLM-RoBERTa."""
