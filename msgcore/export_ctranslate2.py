"""msgcore's Transformer in CTranslate2 (https://github.com/OpenNMT/CTranslate2), the decoding anchor of the peers
report: the same weights, decoded by the fastest CPU Transformer decoder users know.

    spec = transformer_spec(model, tokenizer)            # CTranslate2's model-spec API, weight by weight
    path = export(model, tokenizer, "runs/ct2", "int8")  # a model directory for ctranslate2.Translator
    hyps = translate(ctranslate2.Translator(str(path)), tokenizer, encoded, GenerationConfig(beam_size=5))

The mapping follows CTranslate2's own fairseq converter, whose layer names msgcore's mirror: q/k/v projections fused
into one linear for self-attention and k/v into one for cross-attention, sqrt(d)-scaled token embeddings, the
position table given explicitly (msgcore's sinusoid, from position 0), pre-norm layers with a final norm. Source
sentences go in as msgcore encodes them (pieces, then </s>); the decoder starts from <s> and stops at </s>.

CTranslate2 is a benchmark-only dependency: it lives in the peers venv (book/benchmarks/peers/setup.sh), never in
the book's install, and this module imports it only when called.
"""
from __future__ import annotations

from pathlib import Path

import torch

from msgcore.batching import EncodedCorpus
from msgcore.generation import GenerationConfig
from msgcore.model import Transformer
from msgcore.tokenizer import Tokenizer
from msgcore.utils import MsgcoreError

QUANTIZATIONS = ("float32", "int8")  # the two settings the peers report compares


def transformer_spec(model: Transformer, tokenizer: Tokenizer):
    """CTranslate2's TransformerSpec holding `model`'s weights (a plain msgcore Transformer: chapter 0's)."""
    from ctranslate2.specs import common_spec, transformer_spec as ct2_spec

    cfg = model.cfg
    if type(model) is not Transformer:
        raise MsgcoreError(f"only msgcore's plain Transformer exports to CTranslate2, not {type(model).__name__}")
    if not cfg.pre_norm or cfg.positions != "sinusoidal":
        raise MsgcoreError("CTranslate2 export covers the pre-norm Transformer with sinusoidal positions")
    spec = ct2_spec.TransformerSpec.from_config((cfg.encoder_layers, cfg.decoder_layers), cfg.n_heads,
                                                pre_norm=True, activation=common_spec.Activation.RELU)
    with torch.no_grad():
        set_stack(spec.encoder, model.encoder)
        set_stack(spec.decoder, model.decoder)
        set_linear(spec.decoder.projection, model.decoder.output_projection)
    vocabulary = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    spec.config.bos_token, spec.config.eos_token = vocabulary[tokenizer.bos_id], vocabulary[tokenizer.eos_id]
    spec.config.unk_token, spec.config.decoder_start_token = vocabulary[tokenizer.unk_id], vocabulary[tokenizer.bos_id]
    return spec


def set_stack(spec, stack) -> None:
    """Embeddings, layers and final norm of an encoder or a decoder."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = array(stack.embed.tokens.weight)
    spec.scale_embeddings = stack.embed.scale  # sqrt(d) (§3.4)
    spec.position_encodings.encodings = array(stack.embed.positions.table)  # (max_positions, D), from position 0
    for layer_spec, layer in zip(spec.layer, stack.layers):
        set_attention(layer_spec.self_attention, layer.self_attn, layer.self_attn_norm, self_attention=True)
        if hasattr(layer, "cross_attn"):
            set_attention(layer_spec.attention, layer.cross_attn, layer.cross_attn_norm, self_attention=False)
        set_layer_norm(layer_spec.ffn.layer_norm, layer.ffn_norm)
        set_linear(layer_spec.ffn.linear_0, layer.ffn.w1)
        set_linear(layer_spec.ffn.linear_1, layer.ffn.w2)
    set_layer_norm(spec.layer_norm, stack.final_norm)


def set_attention(spec, attention, norm, self_attention: bool) -> None:
    """q, k, v fused into one linear (self-attention) or q alone and k, v fused (cross-attention), then W^O."""
    projections = [attention.q_proj, attention.k_proj, attention.v_proj]
    fused = [projections] if self_attention else [projections[:1], projections[1:]]
    for linear_spec, group in zip(spec.linear, fused):
        linear_spec.weight = array(torch.cat([p.weight for p in group]))
        linear_spec.bias = array(torch.cat([p.bias for p in group]))
    set_linear(spec.linear[-1], attention.out_proj)
    set_layer_norm(spec.layer_norm, norm)


def set_linear(spec, linear) -> None:
    spec.weight = array(linear.weight)
    if linear.bias is not None:
        spec.bias = array(linear.bias)


def set_layer_norm(spec, norm) -> None:
    spec.gamma, spec.beta = array(norm.weight), array(norm.bias)


def array(tensor: torch.Tensor):
    """A copy: CTranslate2's converter transforms the spec's arrays in place, which must not reach the model."""
    return tensor.detach().float().cpu().numpy().copy()


def export(model: Transformer, tokenizer: Tokenizer, out_dir: str | Path, quantization: str = "float32") -> Path:
    """A CTranslate2 model directory of `model`, its weights stored in `quantization` ("float32" or "int8")."""
    from ctranslate2.converters import Converter

    if quantization not in QUANTIZATIONS:
        raise MsgcoreError(f"quantization {quantization!r}: choose one of {', '.join(QUANTIZATIONS)}")
    spec = transformer_spec(model, tokenizer)

    class SpecConverter(Converter):  # CTranslate2's converters validate, quantize and save a spec
        def _load(self):
            return spec

    return Path(SpecConverter().convert(str(out_dir), quantization=quantization, force=True))


def translate(translator, tokenizer: Tokenizer, encoded: EncodedCorpus, cfg: GenerationConfig,
              batch_size: int = 64) -> list[str]:
    """Detokenized translations of the first source of `encoded`, `batch_size` sentences a call, in corpus order.

    msgcore's length limit is per sentence (a x |x| + b tokens, </s> included); CTranslate2's is per call, so each
    call gets the limit of its longest source (the same limit at batch size 1)."""
    vocabulary = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    index = {piece: i for i, piece in enumerate(vocabulary)}
    pieces = [[vocabulary[i] for i in ids] for ids in encoded.sources[0]]
    out = []
    for start in range(0, len(pieces), batch_size):
        batch = pieces[start:start + batch_size]
        longest = max(len(p) for p in batch)
        results = translator.translate_batch(
            batch, beam_size=cfg.beam_size, length_penalty=cfg.len_penalty, no_repeat_ngram_size=cfg.no_repeat_ngram,
            max_decoding_length=int(cfg.max_len_a * longest + cfg.max_len_b) - 1,  # - 1: CTranslate2 omits </s>
            min_decoding_length=cfg.min_len, max_batch_size=batch_size)
        out += [tokenizer.decode([index[p] for p in r.hypotheses[0]]) for r in results]
    return out
