"""Everything that changes the catalog, one module per job.

- `cached_models`: scans of the Hugging Face cache into rows, and deleting a model from the cache.
- `model_settings`: an admin's (or a config file's) decisions on how models are served, sent to every worker.
- `model_control`: the load/unload round trip with the workers (fire-and-forget or awaited).
- `worker_registry`: what workers report: registration, heartbeats, model events, lost and stopped workers.

Admin actions, commands and views call these; decisions that a worker must act on go out as
`protocol` control messages over the channel layer (`model_control`).
"""
