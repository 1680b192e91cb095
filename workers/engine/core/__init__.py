"""The engine's loop: jobs in, a plan per step (scheduler), fair share, pacing, supervision, metrics."""
