"""Media as the engine takes it: bytes (data: or bounded http(s) fetches) decoded to images, audio and
frames, and word-level timing of speech. No models, no Django: the engine's media prompts and
transcription call down into here."""
