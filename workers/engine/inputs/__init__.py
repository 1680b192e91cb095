"""A job's input processing: chat templates, media prompts, prompt scoring."""
