"""Tensor parallel: one model split across a box's devices, scheduled once.

vLLM's multiprocessing executor, at our size: rank 0 is the worker's own engine (its scheduler decides
every step), ranks 1..N-1 are follower processes that hold their shard of the weights and of the cache.
Each step, rank 0 sends the followers what its runner does to the cache (one message per forward, its
small inputs: which rows, how many tokens, each row's last token) and every rank runs the same forward
over its shard; transformers' tensor-parallel plan (`from_pretrained(tp_plan="auto")`) all-reduces inside
it, and only rank 0 samples.

- `group.py`: the ranks: follower processes, the op pipe, faults; `ranks.py`: the process group they join.
- `loading.py`: a split model's load (the refusals in workers/engine/models/tensor_parallel_plan.py) and runner.
- `follower.py`: a follower rank's loop over rank 0's ops.
- `mirrored_runner.py`: rank 0's runner, which sends each op before doing it.
"""
