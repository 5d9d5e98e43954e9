"""macbatch: local LLM chat and batch jobs on Apple Silicon, one MLX engine underneath."""

__version__ = "0.1.0"

# The optional dependencies that images need (pyproject's extra), as every error about them
# quotes it: here, below the engine and the demo models that both raise such errors.
VISION_EXTRA = "pip install 'macbatch[vision]'"
