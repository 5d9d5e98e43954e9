"""Fine-tunes served beside their base model: LoRA and DoRA adapters read from mlx-lm's and
PEFT's files (``files.py``), each adapted linear layer wrapped once to add the low-rank product
of every row's adapter in a packed step (``layers.py``), and the adapters a runner holds
(``bank.py``). docs/models.md, "Fine-tunes"."""
