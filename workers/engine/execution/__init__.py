"""A step's plan executed: the model runner, its persistent batch, the static step and the KV cache (kv/)."""
