"""The engine: plain Python + torch, testable without Django.

It takes `protocol.SubmitMessage`s and answers with protocol messages through callbacks; nothing
here imports Django, Channels or the web side (`.importlinter`). `config.py` is what it is told at
start (`EngineConfig`, built from the environment by inference_site/inference_settings.py and passed in by
the adapter); `core/engine.py` owns jobs, models and publishing; `core/scheduler.py` decides each step;
`sequences.py` is one request's state; `sample/` picks tokens; `execution/kv/` holds the key/value caches;
`core/model_manager.py` and `models/model_loader.py` own model lifetime.
"""
