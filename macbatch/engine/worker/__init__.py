"""Everything a step needs on the device: the model runner (its model, cache memory, forward,
sampling; a drafter's runner beside it), the compiled decode step, host memory for step buffers,
and what it needs of a distributed group (``ranks.py``)."""
