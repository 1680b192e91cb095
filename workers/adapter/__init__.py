"""The worker process's Channels side: a thin adapter between the channel layer and the engine.

`consumers.py` receives messages, `bridge.py` hands jobs to the engine thread and its output back to
the layer, `routing.py` picks the worker that holds a model, `catalog_sync.py` keeps the worker's
catalog rows, `runtime.py` starts a worker beside `serve`, `resilience.py` retries layer sends.
"""
