"""The model side: the adapter that runs an unmodified mlx-lm model as one packed forward, each
family's quirks in one table (``families.py``), and the runtime patches of mlx-lm (``hooks/``)."""
