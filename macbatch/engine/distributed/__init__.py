"""Tensor parallelism over MLX's own distributed layer (``mx.distributed``, under ``mlx.launch``).

Rank 0 is the brain: the front end, the scheduler and every file or port live there. Each step it
broadcasts the packed batch (``channel``); every rank runs the same packed forward over its shard
of the weights (``sharding``) and its own KV pool for its KV heads; sampling happens on rank 0 and
its tokens reach the others as the next step's token ids. ``follower`` is the loop the other ranks
run, ``watchdog`` turns a rank that stops answering into an exit with a clear message.
"""
