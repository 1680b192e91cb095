"""The reference a media-chat test compares the server with: the model's own greedy `generate`
on what its processor makes of one user message (text + images, audio or both), no server involved."""
from __future__ import annotations

from typing import Any

import torch
from transformers import AutoProcessor

from .conftest import FROM_CACHE


class ProcessorReference:
    """`part` is the content-part type the processor's chat template takes ("image", "audio") for a bare
    media item; an item given as a `(type, item)` pair is a part of that type (an omni model's mixes)."""

    def __init__(self, repo_id: str, model_class, part: str, cache, max_tokens: int, processor: Any = None) -> None:
        self.processor = processor or AutoProcessor.from_pretrained(repo_id, cache_dir=cache, local_files_only=True)
        self.model = model_class.from_pretrained(repo_id, cache_dir=cache, **FROM_CACHE).eval()
        self.part = part
        self.max_tokens = max_tokens

    def greedy(self, text: str, media: list) -> list[int]:
        pairs = [item if isinstance(item, tuple) else (self.part, item) for item in media]
        content = [{"type": kind, kind: item} for kind, item in pairs] + [{"type": "text", "text": text}]
        owner = self.processor if media else self.processor.tokenizer
        inputs = owner.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True, return_tensors="pt")
        with torch.no_grad():
            output = self.model.generate(**inputs, max_new_tokens=self.max_tokens, do_sample=False,
                                         pad_token_id=self.processor.tokenizer.pad_token_id)
        return output[0, inputs["input_ids"].shape[1]:].tolist()

    def decode(self, ids: list[int]) -> str:
        return self.processor.tokenizer.decode(ids, skip_special_tokens=True)
