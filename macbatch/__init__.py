"""macbatch: local LLM chat and batch jobs on Apple Silicon, one MLX engine underneath."""

__version__ = "0.1.0"
