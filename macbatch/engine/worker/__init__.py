"""Everything a step needs on the device: the model runner, the packed batch, the KV pages and the
recurrent state store, the compiled decode step, the compute dtype and host memory for step
buffers."""
