"""Output processing off the step: token ids in, text, stop strings, logprobs, parsed parts and messages out."""
