"""Job kinds beside generation: embeddings, pair scores, transcription."""
