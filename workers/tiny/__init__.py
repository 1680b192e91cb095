"""Tiny models built offline into a Hugging Face cache layout (random weights, a real trained tokenizer),
so the real loading code runs in tests, benchmarks and a fresh `serve` without hub access."""
