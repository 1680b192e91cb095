"""Benchmarks: run by hand (`python -m bench.run`), never as timed unit tests."""
