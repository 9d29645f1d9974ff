"""MixRep (Wu et al., ICML 2020): mixed encoders, two decoders, drop-path gates, co-teaching, the two-tokenizer data.

msgcore/models/mixrep.py. Tiny configs; each test runs in seconds on one CPU thread.
"""
import pytest
import torch

from msgcore.batching import EncodedCorpus, collate
from msgcore.data import synthetic_corpus
from msgcore.generation import GenerationConfig, greedy_search, sequence_log_probs
from msgcore.layers import EncoderOut
from msgcore.model import Transformer, TransformerConfig
from msgcore.models import MODELS
from msgcore.models.mixrep import (STREAMS, MixDecoderLayer, MixRepBatch, MixRepConfig, MixRepCorpus, MixRepTrainer,
                                   MixRepTransformer, StackedMixDecoderLayer, TokenizerPair, branch_gate,
                                   check_same_text, co_teaching_corpus, co_teaching_targets, collate_mixrep,
                                   encode_mixrep, mixrep_lengths, other, pair_segmentations, tokenizer_texts,
                                   train_tokenizers)
from msgcore.trainer import TrainConfig, load_model
from msgcore.utils import MsgcoreError

torch.set_num_threads(1)
V_SP, V_BPE, PAD, BOS, EOS = 40, 30, 0, 2, 3
DIMS = dict(vocab_size=V_SP, bpe_vocab_size=V_BPE, d_model=32, n_heads=4, d_ff=64, encoder_layers=2,
            decoder_layers=2, dropout=0.0)
VARIANTS = [dict(mixing="parallel", pre_norm=True), dict(mixing="parallel", pre_norm=False),
            dict(mixing="stacked", pre_norm=True)]


def mixrep(seed=0, **overrides):
    torch.manual_seed(seed)
    return MixRepTransformer(MixRepConfig(**{**DIMS, **overrides})).eval()


def random_ids(lengths, vocab):
    """(B, max(lengths)) random token ids >= 4, right-padded by the core's collate, and the mask."""
    ids = [torch.randint(4, vocab, (n,)).tolist() for n in lengths]
    batch = collate(EncodedCorpus([ids], [[]] * len(ids), BOS), range(len(ids)))
    return batch.sources[0], batch.source_masks[0]


def two_segmentations(bpe_lengths=(9, 4, 6), sp_lengths=(7, 5, 3)):
    """[x_bpe, x_sp] with their masks; uneven lengths, so every row has padding in some stream."""
    torch.manual_seed(1)
    (bpe, bpe_mask), (sp, sp_mask) = random_ids(bpe_lengths, V_BPE), random_ids(sp_lengths, V_SP)
    return [bpe, sp], [bpe_mask, sp_mask]


def targets(stream, B=3, T=6):
    torch.manual_seed(2)
    vocab = V_BPE if stream == "bpe" else V_SP
    return torch.cat([torch.full((B, 1), BOS), torch.randint(4, vocab, (B, T - 1))], 1)  # (B, T) prefix + y


# ---- shapes, masks, the two encoders' mixing ---------------------------------------------------------

def test_shapes_and_twice_the_parameters_of_a_transformer():
    model, (sources, masks) = mixrep(), two_segmentations()
    memory = model.encode(sources, masks)
    assert [m.hidden.shape for m in memory] == [(3, 9, 32), (3, 7, 32)]
    for stream, vocab in (("bpe", V_BPE), ("sp", V_SP)):
        assert model.decode_stream(stream, targets(stream), memory).logits.shape == (3, 6, vocab)
    assert model.decode(targets("sp"), memory).logits.shape == (3, 6, V_SP)  # the primary stream
    dims = {k: v for k, v in DIMS.items() if k not in ("vocab_size", "bpe_vocab_size")}
    plain = {v: Transformer(TransformerConfig(vocab_size=v, **dims)).num_params() for v in (V_SP, V_BPE)}
    assert model.num_params() == plain[V_SP] + plain[V_BPE]  # two streams, one Transformer each (paper: 27M ~ 2 x 13M)


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_in_one_stream_never_changes_either_stream_at_real_positions(variant):
    model, (sources, masks) = mixrep(**variant), two_segmentations()
    memory = model.encode(sources, masks)
    logits = {s: model.decode_stream(s, targets(s), memory).logits for s in STREAMS}
    for k in range(2):  # more padding (with random tokens under it) in stream k only
        grown, grown_masks = list(sources), list(masks)
        extra = torch.randint(4, 20, (3, 4))
        grown[k] = torch.cat([sources[k].masked_fill(~masks[k], 7), extra], 1)
        grown_masks[k] = torch.cat([masks[k], torch.zeros(3, 4, dtype=torch.bool)], 1)
        new_memory = model.encode(grown, grown_masks)
        for before, after in zip(memory, new_memory):
            torch.testing.assert_close(after.hidden[:, :before.hidden.size(1)][before.mask], before.hidden[before.mask])
        for s in STREAMS:
            torch.testing.assert_close(model.decode_stream(s, targets(s), new_memory).logits, logits[s])


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_stream_reads_the_other_streams_real_tokens(variant):
    model, (sources, masks) = mixrep(**variant), two_segmentations()
    base = model.encode(sources, masks)
    for k in range(2):
        changed = list(sources)
        changed[k] = torch.randint(4, 20, sources[k].shape).masked_fill(~masks[k], PAD)
        other = model.encode(changed, masks)[1 - k]
        assert not torch.allclose(other.hidden[other.mask], base[1 - k].hidden[base[1 - k].mask], atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("stream", STREAMS)
def test_incremental_decoding_equals_full_for_each_decoder(stream, variant):
    model, (sources, masks) = mixrep(**variant), two_segmentations()
    memory, tokens = model.encode(sources, masks), targets(stream)
    full = model.decode_stream(stream, tokens, memory).logits  # (B, T, V)
    cache, steps = None, []
    for t in range(tokens.size(1)):
        out = model.decode_stream(stream, tokens[:, t:t + 1], memory, cache, start_pos=t)
        cache = out.cache
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-5)
    changed = tokens.clone()
    changed[:, 4:] = 5  # later target tokens never change earlier logits (the causal mask)
    torch.testing.assert_close(model.decode_stream(stream, changed, memory).logits[:, :4], full[:, :4])


@pytest.mark.parametrize("stream", STREAMS)
def test_each_decoder_runs_the_core_beam_search(stream):
    """Greedy search through the stream view == the argmax of teacher-forcing its own output; beam search runs."""
    model, (sources, masks) = mixrep(), two_segmentations()
    view = model.stream(stream)
    hyps = greedy_search(view, sources, masks, BOS, EOS, GenerationConfig(beam_size=1, max_len_b=6), [PAD, BOS])
    for row, hyp in enumerate(hyps):
        tokens = torch.tensor([[BOS, *hyp]])
        logits = view.decode(tokens, [m.index_select(torch.tensor([row])) for m in model.encode(sources, masks)]).logits
        logits[..., [PAD, BOS]] = float("-inf")
        assert logits[0, :len(hyp)].argmax(-1).tolist() == hyp
    beams = view.generate(sources, masks, BOS, EOS, GenerationConfig(beam_size=3, max_len_b=6), [PAD, BOS])
    vocab = V_BPE if stream == "bpe" else V_SP
    assert len(beams) == 3 and all(0 <= t < vocab for hyp in beams for t in hyp)
    assert model.generate(sources, masks, BOS, EOS, GenerationConfig(beam_size=2, max_len_b=4)) == \
        model.stream("sp").generate(sources, masks, BOS, EOS, GenerationConfig(beam_size=2, max_len_b=4))


# ---- the equations' equivalences: gate 0 = two Transformers, the gate, the module owner, stacking ----

def transformer_key(key, stream):
    """The MixRep state-dict key that a plain Transformer's key of `stream` corresponds to."""
    if key == "token_embedding.weight":
        return "token_embedding.weight" if stream == "sp" else "bpe_embedding.weight"
    if key.startswith("decoder."):
        return f"decoder.{stream}." + key[len("decoder."):]
    parts = key.split(".")  # encoder.layers.i.module.rest, or encoder.module.rest: the stream follows the module
    at = 4 if parts[1] == "layers" else 2
    return ".".join(parts[:at] + [stream] + parts[at:])


def as_transformer(model, stream):
    """A plain Transformer with `stream`'s weights; the attention read by the gated branch is scaled by
    branch_scale (h = scale * attn = attn with W^O and its bias scaled)."""
    cfg = {k: v for k, v in model.cfg.to_dict().items() if k in TransformerConfig.__dataclass_fields__}
    cfg["vocab_size"] = model.cfg.vocab_size if stream == "sp" else model.cfg.bpe_vocab_size
    plain = Transformer(TransformerConfig(**cfg)).eval()
    source = model.state_dict()
    weights = {key: source[transformer_key(key, stream)].clone() for key in plain.state_dict()}
    for key in weights:
        if (key.startswith("encoder.") and ".self_attn.out_proj." in key) or ".cross_attn.out_proj." in key:
            weights[key] *= model.cfg.branch_scale
    plain.load_state_dict(weights)
    return plain


@pytest.mark.parametrize("branch_scale", [1.0, 0.5])
@pytest.mark.parametrize("pre_norm", [True, False])
def test_with_the_gates_at_zero_the_model_is_two_independent_transformers(branch_scale, pre_norm):
    """Eq. (1)-(2) and (6)-(7) with the other-stream branch weighted 0 (p = 1, so g = 1 - p = 0 at inference):
    each stream is a plain Transformer on its own segmentation."""
    model = mixrep(enc_drop_path=1.0, dec_drop_path=1.0, branch_scale=branch_scale, pre_norm=pre_norm)
    sources, masks = two_segmentations()
    memory = model.encode(sources, masks)
    for k, stream in enumerate(STREAMS):
        plain = as_transformer(model, stream)
        plain_memory = plain.encode([sources[k]], [masks[k]])
        torch.testing.assert_close(memory[k].hidden[masks[k]], plain_memory[0].hidden[masks[k]])
        torch.testing.assert_close(model.decode_stream(stream, targets(stream), memory).logits,
                                   plain.decode(targets(stream), plain_memory).logits)
    gated = mixrep(branch_scale=branch_scale, pre_norm=pre_norm)  # p < 1: the other stream matters
    plain = as_transformer(gated, "sp")
    assert not torch.allclose(gated.encode(sources, masks)[1].hidden[masks[1]],
                              plain.encode([sources[1]], [masks[1]])[0].hidden[masks[1]], atol=1e-4)


def swapped_stream_key(key):
    """The state-dict key of the same parameter with the streams' roles exchanged."""
    if key in ("token_embedding.weight", "bpe_embedding.weight"):
        return "bpe_embedding.weight" if key.startswith("token") else "token_embedding.weight"
    parts = key.split(".")
    return ".".join({"bpe": "sp", "sp": "bpe"}.get(part, part) for part in parts)


@pytest.mark.parametrize("variant", [dict(mix_attention_owner="keys"), dict(mix_attention_owner="queries"),
                                     dict(mixing="stacked", stacked_order="own_first")])
def test_the_streams_are_symmetric(variant):
    """Swapping the BPE and SP inputs together with the two streams' parameters swaps the outputs: no stream is
    treated specially by the equations (one vocabulary size, so the parameters fit either stream)."""
    model = mixrep(bpe_vocab_size=V_SP, **variant)
    swapped = mixrep(bpe_vocab_size=V_SP, **variant)
    state = model.state_dict()
    swapped.load_state_dict({key: state[swapped_stream_key(key)] for key in swapped.state_dict()})
    (bpe, sp), (bpe_mask, sp_mask) = two_segmentations()
    bpe = bpe.clamp(max=V_SP - 1)
    memory = model.encode([bpe, sp], [bpe_mask, sp_mask])
    swapped_memory = swapped.encode([sp, bpe], [sp_mask, bpe_mask])
    for k in range(2):
        torch.testing.assert_close(swapped_memory[1 - k].hidden, memory[k].hidden)
    tokens = targets("sp")
    for stream in STREAMS:
        torch.testing.assert_close(swapped.decode_stream(other(stream), tokens, swapped_memory).logits,
                                   model.decode_stream(stream, tokens, memory).logits)


def test_a_resumed_run_is_bit_exact_with_the_gates_on(toy, tmp_path):
    """The gates draw from the torch RNG, which the Trainer's checkpoints restore."""
    corpus, pair, data = toy

    def trainer(max_steps, out):
        model = mixrep(vocab_size=pair.sp.vocab_size, bpe_vocab_size=pair.bpe.vocab_size, enc_drop_path=0.5,
                       dec_drop_path=0.5, dropout=0.1)
        cfg = TrainConfig(max_steps=max_steps, max_tokens=200, warmup_steps=2, progress=False)
        return MixRepTrainer(model, pair, data, None, None, cfg, torch.device("cpu"), tmp_path / out)

    straight = trainer(4, "straight")
    straight.train()
    first = trainer(2, "resumed")
    first.train()
    resumed = trainer(4, "resumed")
    resumed.resume(tmp_path / "resumed" / "last.pt")
    resumed.train()
    for key, value in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], value), key


def test_drop_path_gate_is_a_per_call_bernoulli_in_training_and_one_minus_p_at_inference():
    torch.manual_seed(0)
    draws = torch.tensor([branch_gate(0.3, training=True) for _ in range(10_000)])
    assert set(draws.tolist()) == {0.0, 1.0}
    assert abs(draws.mean().item() - 0.7) < 0.02  # kept with probability 1 - p, no 1/(1-p) rescaling
    assert branch_gate(0.3, training=False) == pytest.approx(0.7)
    assert branch_gate(0.0, training=True) == 1.0 and branch_gate(1.0, training=True) == 0.0
    # In the model the gates are drawn anew at every forward pass, one per layer and stream in the encoder: the
    # BPE output of a 2-layer encoder depends on 3 of them (bpe and sp in layer 1, bpe in layer 2).
    sources, masks = two_segmentations()
    model = mixrep(enc_drop_path=0.5, dec_drop_path=0.5).train()
    outputs = {tuple(model.encode(sources, masks)[0].hidden[0, 0, :3].tolist()) for _ in range(60)}
    assert 1 < len(outputs) <= 2 ** 3
    memory = model.eval().encode(sources, masks)
    model.train()  # the decoder: one gate per layer, 2 layers
    tokens = targets("sp")  # (it reseeds the RNG: made once)
    outputs = {tuple(model.decode_stream("sp", tokens, memory).logits[0, -1, :3].tolist()) for _ in range(40)}
    assert 1 < len(outputs) <= 2 ** 2


def test_the_mix_attention_module_is_owned_by_the_key_stream_or_the_query_stream():
    """VAGUE-M1: the code shares attn_m^bpe with the SP stream's self-attention (keys), §4.1's text with the BPE
    stream's own (queries). In a 1-layer encoder, perturbing the SP self-attention changes the BPE output only
    when the BPE stream borrows that module."""
    sources, masks = two_segmentations()
    for owner, bpe_changes in (("keys", True), ("queries", False)):
        model = mixrep(encoder_layers=1, mix_attention_owner=owner)
        layer = model.encoder.layers[0]
        assert layer.mix_attention("bpe") is layer.self_attn["sp" if owner == "keys" else "bpe"]
        base = model.encode(sources, masks)[0].hidden
        with torch.no_grad():
            for p in layer.self_attn["sp"].parameters():
                p.add_(0.5 * torch.randn_like(p))
        moved = model.encode(sources, masks)[0].hidden
        assert (not torch.allclose(moved[masks[0]], base[masks[0]], atol=1e-4)) == bpe_changes


def test_stacked_layers_read_the_other_streams_post_self_attention_state_in_the_texts_order():
    """§5.1: the stacked encoder's mix-attention reads the other stream's state after its self-attention (so in a
    1-layer encoder the SP self-attention weights reach the BPE output even with query-owned modules), and the
    stacked decoder attends to the other encoder first (dec_bpe: SP-attention, then BPE-attention)."""
    sources, masks = two_segmentations()
    model = mixrep(encoder_layers=1, mixing="stacked")
    layer = model.encoder.layers[0]
    base = model.encode(sources, masks)[0].hidden
    with torch.no_grad():
        for p in layer.self_attn["sp"].parameters():
            p.add_(0.5 * torch.randn_like(p))
    assert not torch.allclose(model.encode(sources, masks)[0].hidden[masks[0]], base[masks[0]], atol=1e-4)
    for order, first in (("other_first", "other_attn"), ("own_first", "cross_attn")):
        model = mixrep(mixing="stacked", stacked_order=order)
        dec_layer = model.decoder["bpe"].layers[0]
        assert isinstance(dec_layer, StackedMixDecoderLayer)
        seen = []
        for name in ("cross_attn", "other_attn"):
            getattr(dec_layer, name).register_forward_hook(lambda m, args, out, name=name: seen.append(
                (name, args[1].size(1))))
        model.decode_stream("bpe", targets("bpe"), model.encode(sources, masks))
        assert seen[0][0] == first
        assert dict(seen) == {"cross_attn": 9, "other_attn": 7}  # own = H_bpe (9 long), other = H_sp (7)


def test_decoder_layer_mixes_own_and_other_encoder_as_eq_6():
    torch.manual_seed(0)
    layer = MixDecoderLayer(MixRepConfig(**DIMS)).eval()
    x = torch.randn(2, 3, 32)
    sources, masks = two_segmentations((5, 3), (4, 4))
    own, oth = EncoderOut(torch.randn(2, 5, 32), masks[0]), EncoderOut(torch.randn(2, 4, 32), masks[1])
    h, kv, _ = layer.cross_attend(x, [own, oth], None, False)
    single = [layer.cross_attn(x, m.hidden, m.mask[:, None, None, :])[0] for m in (own, oth)]
    torch.testing.assert_close(h, 0.5 * single[0] + 0.5 * (1 - 0.3) * single[1])  # Eq. (6), g = 1 - p_dec
    assert len(kv) == 2 and kv[0][0].size(2) == 5 and kv[1][0].size(2) == 4


# ---- Eq. (8)-(10): the loss, co-teaching -------------------------------------------------------------

def hand_made_batch():
    """Two examples with the same sources: an original (y_bpe, y_sp) and its co-teaching example
    (y^_{sp->bpe}, y^_{bpe->sp}); ids written by hand, lengths differ between streams."""
    x_bpe, x_sp = [7, 8, 9, 10, EOS], [11, 12, 13, EOS]
    data = MixRepCorpus([[x_bpe, x_bpe], [x_sp, x_sp]], target=[[20, 21, 22], [23, 24]], target_prefix=BOS,
                        eos_id=EOS, bpe_target=[[5, 6, 7, 8], [9, 10, 11]])
    return data, collate_mixrep(data, [0, 1])


def test_loss_is_eq_8_on_data_and_eq_10_on_data_plus_co_teaching_examples():
    model = mixrep(seed=3)
    data, batch = hand_made_batch()
    assert isinstance(batch, MixRepBatch) and batch.num_target_tokens == (3 + 1) + (2 + 1) + (4 + 1) + (3 + 1)
    log_p = {}
    for stream in STREAMS:  # log P_s(y | x_bpe, x_sp) per example, by the generation module's scorer
        hyps = data.bpe_target if stream == "bpe" else data.target
        log_p[stream], _ = sequence_log_probs(model.stream(stream), batch.sources, batch.source_masks, BOS, EOS, hyps)
    nll = -(log_p["bpe"][0] + log_p["sp"][0])  # Eq. (8), one example
    co = -(log_p["bpe"][1] + log_p["sp"][1])  # Eq. (9): each decoder on the other decoder's re-tokenized output
    torch.testing.assert_close(model.loss(batch), nll + co)  # Eq. (10) = Eq. (8) + Eq. (9), summed over tokens
    torch.testing.assert_close(model.loss(collate_mixrep(data, [0])), nll)
    # Label smoothing per stream: (1 - eps) * (-log p_y) + eps * mean_v(-log p_v), summed over real tokens.
    memory, expected = model.encode(batch.sources, batch.source_masks), 0.0
    for stream in STREAMS:
        target_in, target_out = batch.targets(stream)
        log_probs = torch.log_softmax(model.decode_stream(stream, target_in, memory).logits, -1)
        real = target_out != PAD
        gold = -log_probs.gather(-1, target_out.unsqueeze(-1)).squeeze(-1)
        expected = expected + ((0.9 * gold + 0.1 * -log_probs.mean(-1)) * real).sum()
    torch.testing.assert_close(model.loss(batch, label_smoothing=0.1), expected)


# ---- the two tokenizers and the data --------------------------------------------------------------

@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A one-source toy corpus, its two tokenizers (BPE, unigram) and its MixRep encoding."""
    corpus = synthetic_corpus(48, num_sources=1, seed=0)
    pair = train_tokenizers(tokenizer_texts(corpus), vocab_size=60, cache_dir=tmp_path_factory.mktemp("tok"))
    return corpus, pair, encode_mixrep(corpus, pair)


def test_two_tokenizers_segment_one_corpus_two_ways(toy):
    corpus, pair, data = toy
    assert pair.bpe.to_bytes() != pair.sp.to_bytes()
    assert len(data) == 48 and len(data.sources) == 2
    assert data.sources[0][0] == pair.bpe.encode(corpus.sources[0][0]) + [EOS]
    assert data.sources[1][0] == pair.sp.encode(corpus.sources[0][0]) + [EOS]
    assert data.bpe_target[0] == pair.bpe.encode(corpus.target[0])
    assert data.target[0] == pair.sp.encode(corpus.target[0])
    assert any(b != s for b, s in zip(data.bpe_target, data.target))  # the segmentations really differ
    check_same_text(data, pair)
    batch = collate_mixrep(data, range(5))
    assert batch.bpe_target_in.shape == (5, max(len(y) for y in data.bpe_target[:5]) + 1)
    assert batch.to("cpu").bpe_target_out.equal(batch.bpe_target_out) and isinstance(batch.to("cpu"), MixRepBatch)
    moved = batch.to("cpu", non_blocking=True)  # the trainer's copy (from pinned memory on a GPU)
    assert isinstance(moved, MixRepBatch) and moved.bpe_target_mask.equal(batch.bpe_target_mask)
    assert moved.indices == batch.indices and moved.num_target_tokens == batch.num_target_tokens
    assert all(n >= max(len(y) + 1, len(x)) for n, y, x in zip(mixrep_lengths(data), data.bpe_target, data.sources[0]))


def test_co_teaching_data_has_the_right_size_and_each_decoders_output_in_the_other_segmentation(toy):
    _, pair, data = toy
    model = mixrep(vocab_size=pair.sp.vocab_size, bpe_vocab_size=pair.bpe.vocab_size)
    small = MixRepCorpus([c[:6] for c in data.sources], data.target[:6], data.target_prefix, data.eos_id,
                         bpe_target=data.bpe_target[:6])
    cfg = GenerationConfig(beam_size=2, max_len_b=5)
    union = co_teaching_corpus(model, small, pair, cfg=cfg)
    assert len(union) == 12 and union.sources[0] == small.sources[0] * 2 and union.sources[1] == small.sources[1] * 2
    assert union.target[:6] == small.target and union.bpe_target[:6] == small.bpe_target
    batch = collate(small, range(6))
    outputs = {s: model.stream(s).generate(batch.sources, batch.source_masks, BOS, EOS, cfg, [PAD, BOS])
               for s in STREAMS}
    assert union.bpe_target[6:] == pair.bpe.encode_batch(pair.sp.decode_batch(outputs["sp"]))  # y^_{sp->bpe}
    assert union.target[6:] == pair.sp.encode_batch(pair.bpe.decode_batch(outputs["bpe"]))  # y^_{bpe->sp}
    direct = co_teaching_targets(model, batch.sources, batch.source_masks, pair, BOS, cfg)
    assert direct == {"bpe": union.bpe_target[6:], "sp": union.target[6:]}


def test_tiny_model_overfits_a_toy_set_in_both_segmentations(toy):
    _, pair, data = toy
    data = MixRepCorpus([c[:16] for c in data.sources], data.target[:16], data.target_prefix, data.eos_id,
                        bpe_target=data.bpe_target[:16])
    batch = collate_mixrep(data, range(16))
    model = mixrep(vocab_size=pair.sp.vocab_size, bpe_vocab_size=pair.bpe.vocab_size).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for step in range(300):  # about 60 steps (with the drop-path gates on)
        loss = model.loss(batch) / batch.num_target_tokens
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.05:
            break
    assert loss.item() < 0.05, (step, loss.item())
    for stream, want in (("bpe", data.bpe_target), ("sp", data.target)):
        hyps = model.stream(stream).generate(batch.sources, batch.source_masks, BOS, EOS,
                                             GenerationConfig(beam_size=1), [PAD, BOS])
        assert sum(h == y for h, y in zip(hyps, want)) >= 15, stream


def test_trainer_checkpoint_round_trip_with_the_tokenizer_pair(toy, tmp_path):
    corpus, pair, data = toy
    model = mixrep(vocab_size=pair.sp.vocab_size, bpe_vocab_size=pair.bpe.vocab_size, enc_drop_path=0.2)
    cfg = TrainConfig(max_steps=3, max_tokens=300, warmup_steps=2, valid_max_sentences=4, progress=False)
    trainer = MixRepTrainer(model, pair, data, data, corpus.target, cfg, torch.device("cpu"), tmp_path)
    history = trainer.train()
    assert [row["step"] for row in history if row["kind"] == "valid"] == [3]
    assert trainer.lengths == mixrep_lengths(data)
    loaded, tokenizers = load_model(tmp_path / "last.pt")
    assert MODELS["MixRepTransformer"] is MixRepTransformer and isinstance(loaded, MixRepTransformer)
    assert loaded.cfg == model.cfg and isinstance(tokenizers, TokenizerPair)
    assert (tokenizers.bpe.to_bytes(), tokenizers.sp.to_bytes()) == (pair.bpe.to_bytes(), pair.sp.to_bytes())
    batch = collate_mixrep(data, range(4))
    model.eval()
    for stream in STREAMS:
        target_in, _ = batch.targets(stream)
        torch.testing.assert_close(
            loaded.decode_stream(stream, target_in, loaded.encode(batch.sources, batch.source_masks)).logits,
            model.decode_stream(stream, target_in, model.encode(batch.sources, batch.source_masks)).logits)


# ---- errors -----------------------------------------------------------------------------------

def test_errors_are_one_line(toy, tmp_path):
    corpus, pair, data = toy
    model, (sources, masks) = mixrep(), two_segmentations()
    checks = [
        (lambda: MixRepConfig(mixing="summed"), "mixing"),
        (lambda: MixRepConfig(mix_attention_owner="values"), "mix_attention_owner"),
        (lambda: MixRepConfig(enc_drop_path=1.5), "enc_drop_path"),
        (lambda: MixRepConfig(stacked_order="x"), "stacked_order"),
        (lambda: model.encode(sources[:1], masks[:1]), "2 segmentations"),
        (lambda: model.stream("wordpiece"), "unknown MixRep stream"),
        (lambda: model.loss(collate(data, range(3))), "MixRepBatch"),
        (lambda: train_tokenizers(["a b"], sp_type="wordpiece", cache_dir=tmp_path), "unknown tokenizer type"),
        (lambda: MixRepCorpus([data.sources[0], data.sources[1][:5]], data.target, BOS, bpe_target=data.bpe_target),
         "mismatched segmentations"),
        (lambda: MixRepCorpus([data.sources[0]], data.target, BOS, bpe_target=data.bpe_target), "2 segmentations"),
        (lambda: pair_segmentations(EncodedCorpus([data.sources[0]], data.bpe_target, BOS),
                                    EncodedCorpus([data.sources[1][:-1]], data.target[:-1], BOS)),
         "mismatched segmentations"),
        (lambda: pair_segmentations(EncodedCorpus([data.sources[0]], data.bpe_target, BOS),
                                    EncodedCorpus([data.sources[1][::-1]], data.target[::-1], BOS), pair),
         "mismatched segmentations: example 0"),
        (lambda: encode_mixrep(synthetic_corpus(4, num_sources=2), pair), "one source sentence"),
        (lambda: collate_mixrep(EncodedCorpus(data.sources, data.target, BOS), [0]), "encode_mixrep"),
        (lambda: TokenizerPair.from_bytes(pair.sp.to_bytes()), "not a MixRep tokenizer pair"),
        (lambda: model.decode_stream("bpe", targets("bpe"), model.encode(sources, masks)[:1]), "2 encoder outputs"),
    ]
    for call, message in checks:
        with pytest.raises(MsgcoreError, match=message) as error:
            call()
        assert "\n" not in str(error.value), str(error.value)
