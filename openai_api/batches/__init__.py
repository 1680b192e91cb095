"""OpenAI's Files and Batch APIs: uploads kept per team, batches run line by line at `batch` priority.

`models.py` the rows, `files.py` the stored files, `service.py` creating, reading and cancelling
batches, `lines.py` one line through the endpoints' own pipeline, `runner.py` the background runner
(heartbeats, takeover after a restart), `views.py` the thin HTTP views. See docs/batch.md.
"""
