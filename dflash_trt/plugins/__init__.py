"""DFlash's two custom operations, each with interchangeable implementations.

* ``kv_injection``: tapped target hidden states of newly committed tokens -> fc ->
  hidden_norm -> every draft layer's k_norm(k_proj(.)) with RoPE, and v_proj(.) ->
  written into the drafter's paged context KV cache at each sequence's slots.
* ``block_attention``: block queries attend non-causally to [the sequence's context K/V
  from the paged cache ++ the block's own K/V], with GQA, per-sequence context lengths,
  and optional causal / sliding-window modes.

``ops`` holds the dispatch (``kernels="reference" | "triton"``) and the paged cache; the
per-op modules hold the reference (the executable specification), the Triton kernel, the
torch custom op, the ONNX mapping and the TensorRT plugin definition.
"""
