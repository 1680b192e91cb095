"""The engine: plain Python + torch, testable without Django.

It takes `protocol.SubmitMessage`s and answers with protocol messages through callbacks; nothing
here imports Django, Channels or the web side (`.importlinter`). `engine.py` owns jobs, models and
publishing; `scheduler.py` decides each step; `sequences.py` is one request's state; `sampling.py`
and `constraints.py` pick tokens; `kv/` holds the key/value caches; `model_manager.py` and
`model_loader.py` own model lifetime.
"""
