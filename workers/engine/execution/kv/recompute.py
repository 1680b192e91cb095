"""Models that keep no cache the engine can continue, served by recomputing the whole text every token.

OpenAI GPT, XLM, XLNet and Reformer return no cache; RWKV and RecurrentGemma keep their state inside the
model; MiniMax and xLSTM keep caches of classes of their own. `generate` serves them all by running the
model over the whole text at every step (or over its own state), and so does the engine for these: each
such row alone, its inputs prepared by the model's own `prepare_inputs_for_generation` (XLNet and XLM
append a mask token and say where to predict). The cost grows with the square of the length, which the
load log says. A model is served so only where its recomputed logits equal its own `generate`'s, measured
at load (`recompute_problem`): CPM-Ant's cached path, for one, drifts from its whole-text forward.
"""
from __future__ import annotations

from typing import Callable

import torch

RECOMPUTED = "recomputed"  # a row's state: nothing kept between steps but its tokens
PROBE_TOKENS = 4


def whole_text_inputs(model, ids: list[int], device: torch.device) -> dict:
    """The forward's inputs for the next token after `ids`, as `generate` prepares them without a cache."""
    tensor = torch.tensor([ids], device=device)
    inputs = model.prepare_inputs_for_generation(tensor, attention_mask=torch.ones_like(tensor), use_cache=False)
    return {**{key: value for key, value in inputs.items() if value is not None}, "use_cache": False}


def prompt_logits(forward: Callable[[dict], torch.Tensor], model, ids: list[int], device: torch.device,
                  ) -> torch.Tensor:
    """Every prompt position's next-token logits [len(ids), vocab] (echo + logprobs): one forward where the
    prepared inputs are the prompt itself, else one per position (models that append a token to predict)."""
    inputs = whole_text_inputs(model, ids, device)
    if inputs.get("input_ids") is not None and inputs["input_ids"].shape[-1] == len(ids):
        return forward(inputs)[0]
    return torch.stack([forward(whole_text_inputs(model, ids[:end], device))[0, -1] for end in range(1, len(ids) + 1)])


def recompute_problem(model, device: torch.device, near: Callable[[torch.Tensor, torch.Tensor], bool]) -> str:
    """Why the whole-text forward does not give the logits the model's own `generate` gives ("" when it does),
    over a few greedy tokens after a random prompt."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(3, vocab, (1, 11), generator=torch.Generator().manual_seed(3)).to(device)
    try:
        with torch.inference_mode():
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=PROBE_TOKENS,
                                       min_new_tokens=PROBE_TOKENS, do_sample=False, output_logits=True,
                                       return_dict_in_generate=True)
            text = generated.sequences[0].tolist()
            for step, want in enumerate(generated.logits):
                inputs = whole_text_inputs(model, text[:ids.shape[1] + step], device)
                if not near(model(**inputs).logits[0, -1], want[0]):
                    return "its whole-text forward and its own generate give other logits"
    except Exception as exc:
        return f"its generate or whole-text forward failed ({type(exc).__name__}: {str(exc)[:120]})"
    return ""


def prefill_whole_text(forward: Callable, loaded, seq) -> tuple[int, torch.Tensor]:
    """A row's prefill: the whole prompt's forward (`forward(rows, **inputs)`: the runner's), scored at every
    position where the request asks; returns (prompt tokens fed, the next token's logits)."""
    model, device, take = loaded.model, loaded.device, len(seq.prompt_ids) - seq.prefilled
    seq.state, seq.prefilled = RECOMPUTED, len(seq.prompt_ids)
    if seq.wants_prompt_logprobs:
        scores = prompt_logits(lambda inputs: forward([seq], **inputs).logits, model, seq.prompt_ids, device)
        seq.record_prompt_chunk(scores, last=True)
        return take, scores[-1]
    return take, forward([seq], **whole_text_inputs(model, seq.prompt_ids, device)).logits[0, -1]


def next_logits(forward: Callable, loaded, seq) -> torch.Tensor:
    """A row's decode step: the whole text so far, its next token's logits [1, vocab]."""
    inputs = whole_text_inputs(loaded.model, seq.prompt_ids + seq.completion_ids, loaded.device)
    return forward([seq], **inputs).logits[:, -1, :]
