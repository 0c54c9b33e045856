"""Inference: a prompt in, greedy tokens out, over a KV cache (docs/design.md §8).

The path of one batch of prompts, module by module:

    prompt [B, T] ──prefill.py──▶ kv_cache.py ──step.py (× new tokens)──▶ tokens
                   (model forward   (keys/values,   (one token per row,
                    in chunks)       ids, end)        fixed shapes, no host sync)

1. `generation.generate` (the loop every benchmark decodes through): left-pads prompts of
   any lengths into one batch (padding is a document of its own), opens a cache with
   `Llama.new_kv_cache`, and applies each row's stop rules to the tokens it reads back.
2. `prefill.prefill`: the prompt through `Llama.forward` into the cache, in chunks of
   `prefill_chunk_tokens` columns; chunk c attends the cached keys of chunks 0..c-1, so
   the logits do not depend on the chunk size. `greedy_generate_recompute` is the slow,
   obviously right reference the tests compare against.
3. `kv_cache.KVCache`: full layers keep every key in one preallocated buffer, sliding
   layers their last W - 1; document and position ids of every cached key, each row's
   current document start and the length on the device (`end`).
4. `step`: what a decoding step (one new token per row) builds once and every layer reads:
   `DecodeKeys` (where the token's keys are), `DecodeMask` (which of them each pass sees)
   and `decode_attention` (every pass in one kernel call). A forward of one token per row
   over a cache is `Llama.decode_step`; model/layer_attention.py decides each layer's `Step`.
5. `kernel`: the Triton decoding kernel (CUDA, `eval.cuda_decoding` kernel), the union
   softmax of all passes in one launch.
6. `graph.DecodeGraph`: the step recorded once as a CUDA graph and replayed
   (`eval.cuda_decoding` graph), since a small model's step waits on Python dispatch.

The package imports the model (model/llama.py); the model imports only `kv_cache` and
`step` from it. This file imports nothing, so that either direction loads without a circle.
"""
