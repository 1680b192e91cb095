"""Which proposer a model's runner gets: n-gram lookup, a draft model, or none where its cache cannot drop
rejected drafts (said once at load)."""
from __future__ import annotations

import logging

from protocol.speculative import SpeculativeConfig
from workers.engine.execution.kv.specs import FULL, NONE, SLIDING, STATE, CacheSpec
from workers.engine.speculation.draft import DraftProposer
from workers.engine.speculation.rows import NgramProposer
from workers.engine.speculation.step_cost import measure_step_cost

logger = logging.getLogger(__name__)


def proposer_for(spec: CacheSpec, loaded, config: SpeculativeConfig | None, most_rows: int) -> NgramProposer | None:
    """A model's draft proposer, where its cache can drop rejected drafts: by length in full-attention layers
    (any batch); while one row decodes, sliding-window layers (no holes) and recurrent ones that continue a
    state over several tokens (the state restored and advanced by what was kept); else none, said at load."""
    if config is None:
        return None
    why_not = ("its cache does not decode in one batch" if not spec.batchable
               else "its recurrent layers restart on a multi-token input" if not spec.continues_chunks
               else "a layer of a kind that cannot drop rejected drafts"
               if any(layer.kind not in (FULL, NONE, SLIDING, STATE) for layer in spec.layers)
               else "LoRA adapters pick their weights per row" if loaded.peft is not None
               else f"its draft model {config.model} was not loaded"
               if config.method == "draft_model" and loaded.draft is None else "")
    if why_not:
        logger.info("speculative decoding off for %s: %s", loaded.model_id, why_not)
        return None
    alone = spec.has(SLIDING) or spec.has(STATE)
    cost = measure_step_cost(loaded.model, loaded.device,
                             (1 if alone else max(1, most_rows)) * (config.num_speculative_tokens + 1))
    logger.info("speculative decoding on for %s: %s%s; %s", loaded.model_id, config.describe(),
                " (while one row decodes: its sliding-window or recurrent layers cannot drop rejected drafts by a "
                "mask)" if alone else "", cost.describe())
    proposer = (DraftProposer(config, loaded.draft, cost=cost) if config.method == "draft_model"
                else NgramProposer(config, cost=cost))
    proposer.alone = alone
    return proposer
