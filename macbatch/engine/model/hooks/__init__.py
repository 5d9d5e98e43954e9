"""Runtime patches of mlx-lm's code, each with why it exists."""
