"""What a request asks of the sampler (``params.py``) and the batched sampler (``sampler.py``)."""
