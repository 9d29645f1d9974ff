"""msgcore: multi-source sequence generation, the library behind the reproduction book.

Modules, read in this order:
    utils       devices, seeds, atomic files, provenance
    attention   one MultiHeadAttention (SDPA + a math path), explicit KV cache
    embeddings  token, position and segment embeddings
    layers      encoder and decoder layers (pre- or post-norm)
    model       TransformerConfig, presets, Encoder, Decoder, Transformer
    generation  greedy and beam search over the KV cache
    trainer     optimisation, validation, checkpoints
    metrics     thin wrappers over sacrebleu
    data, tokenizer, batching, download   the real-data pipeline
    models/     one small file per paper, built on the core above
"""
__version__ = "0.1.0"
