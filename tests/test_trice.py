"""TRICE (msgcore/models/trice.py): fine encoder, separated cross-attention, stages, equivalences."""
from types import SimpleNamespace

import pytest
import torch

from msgcore.batching import concatenate_sources, split_sources
from msgcore.data import synthetic_corpus
from msgcore.layers import DecoderLayer
from msgcore.model import Transformer, preset
from msgcore.models.trice import (SeparatedCrossAttentionLayer, TriceConfig, TriceTransformer, from_single_source,
                                  sample_single_source)

DIMS = dict(vocab_size=40, d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0)


def sources(K, B=3, lengths=(5, 7, 4), vocab=40):
    """K padded sources of different lengths; sentence 0 has padding in every source."""
    toks, masks = [], []
    for k in range(K):
        tokens = torch.randint(4, vocab, (B, lengths[k]))
        mask = torch.ones(B, lengths[k], dtype=torch.bool)
        mask[0, lengths[k] - 2:] = False
        tokens[~mask] = 0
        toks.append(tokens)
        masks.append(mask)
    return toks, masks


def trice(**overrides):
    torch.manual_seed(0)
    return TriceTransformer(TriceConfig(**{**DIMS, **overrides})).eval()


@pytest.mark.parametrize("K", [2, 3])
def test_encode_shapes_and_padding_invariance(K):
    model = trice(fine_layers=2)
    toks, masks = sources(K)
    outs = model.encode(toks, masks)
    assert [o.hidden.shape for o in outs] == [(3, n, 32) for n in (5, 7, 4)[:K]]
    changed = [t.clone() for t in toks]
    for t, m in zip(changed, masks):
        t[~m] = torch.randint(4, 40, (int((~m).sum()),))
    for before, after in zip(outs, model.encode(changed, masks)):
        torch.testing.assert_close(after.hidden[after.mask], before.hidden[before.mask])


def test_fine_encoder_mixes_sources_only_with_cross_attention():
    toks, masks = sources(2)
    for cross, should_change in ((True, True), (False, False)):
        model = trice(fine_layers=1, fine_cross_attention=cross, concatenated_encoding=False)
        base = model.encode(toks, masks)[0].hidden
        other = [toks[0], torch.randint(4, 40, toks[1].shape)]
        moved = model.encode(other, masks)[0].hidden
        assert (not torch.allclose(base, moved)) == should_change


def test_separated_cross_attention_is_the_mean_of_single_source_attentions():
    torch.manual_seed(0)
    layer = SeparatedCrossAttentionLayer(32, 4, 64, 0.0, 0.0, 0.0, True).eval()
    single = DecoderLayer(32, 4, 64, 0.0, 0.0, 0.0, True).eval()
    single.load_state_dict(layer.state_dict())
    model = trice(fine_layers=0)
    toks, masks = sources(3)
    memory = model.encode(toks, masks)
    x = torch.randn(3, 6, 32)
    joint, caches, _ = layer.cross_attend(x, memory, None, False)
    each = [single.cross_attend(x, [m], None, False)[0] for m in memory]
    torch.testing.assert_close(joint, torch.stack(each).mean(0))
    assert len(caches) == 3


@pytest.mark.parametrize("K", [1, 2, 3])
def test_incremental_decoding_equals_full(K):
    model = trice(fine_layers=1)
    toks, masks = sources(K)
    target = torch.randint(4, 40, (3, 6))
    memory = model.encode(toks, masks)
    full = model.decode(target, memory).logits
    cache, steps = None, []
    for t in range(6):
        out = model.decode(target[:, t:t + 1], memory, cache, start_pos=t)
        cache, steps = out.cache, steps + [out.logits]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)
    assert len(cache[0].cross_kv) == K


def test_one_source_without_fine_encoder_equals_the_transformer():
    torch.manual_seed(0)
    single = Transformer(preset("tiny", **DIMS)).eval()
    model = from_single_source(single, TriceConfig(**DIMS, fine_layers=0, embedding_norm=False)).eval()
    toks, masks = sources(1)
    batch = SimpleNamespace(sources=toks, source_masks=masks, target_in=torch.randint(4, 40, (3, 5)))
    torch.testing.assert_close(model(batch), single(batch))


def test_stage_two_copies_stage_one_and_gives_the_fine_encoder_an_absolute_lr(tmp_path):
    from msgcore.trainer import Trainer, TrainConfig

    torch.manual_seed(0)
    single = TriceTransformer(TriceConfig(**DIMS, fine_layers=0))
    model = from_single_source(single, TriceConfig(**DIMS, fine_layers=1, base_lr=5e-5, fine_lr=5e-4))
    torch.testing.assert_close(model.encoder.layers[0].ffn.w1.weight, single.encoder.layers[0].ffn.w1.weight)
    torch.testing.assert_close(model.encoder.embed.norm.weight, single.encoder.embed.norm.weight)
    rest, fine = model.parameter_groups()
    assert {id(p) for p in fine["params"]} == {id(p) for p in model.fine_encoder.parameters()}
    assert len(rest["params"]) + len(fine["params"]) == len(list(model.parameters()))
    from msgcore.batching import EncodedCorpus

    toy = EncodedCorpus([[[5, 6, 3]] * 4], [[7, 8]] * 4, 1, 3)
    trainer = Trainer(model, None, toy, None, None, TrainConfig(lr=5e-5, progress=False), torch.device("cpu"), tmp_path)
    peak = [g["initial_lr"] for g in trainer.optimizer.param_groups]
    assert peak == pytest.approx([5e-5, 5e-4])  # 5e-4 absolute, not 10x of whatever the base lr is


def test_the_segment_embedding_is_followed_by_a_layernorm():
    model = trice(fine_layers=0)
    embed = model.encoder.embed
    tokens = torch.randint(4, 40, (2, 6))
    segments = torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)
    positions = torch.tensor([[0, 1, 2, 0, 1, 2]] * 2)
    raw = embed.scale * embed.tokens(tokens) + embed.positions(positions) + embed.segments(segments)
    torch.testing.assert_close(embed(tokens, positions, segments), embed.norm(raw))  # LN(tok + pos + seg)
    out = embed(tokens, positions, segments)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)
    assert isinstance(model.decoder.embed.norm, torch.nn.LayerNorm)
    assert not hasattr(trice(fine_layers=0, embedding_norm=False).encoder.embed, "norm")


def test_segment_embedding_and_joint_variant():
    toks, masks = sources(2)
    with_segments = trice(fine_layers=0).encode(toks, masks)[0].hidden
    without = trice(fine_layers=0, segment_embedding=False).encode(toks, masks)[0].hidden
    assert not torch.allclose(with_segments, without)
    joint = trice(separated_cross_attention=False).encode(toks, masks)
    assert len(joint) == 1 and joint[0].hidden.shape == (3, 12, 32)


def test_concatenate_then_split_round_trips():
    toks, masks = sources(3)
    packed, segments, positions, mask = concatenate_sources(toks, masks)
    assert mask.sum().item() == sum(m.sum().item() for m in masks)
    features = packed.unsqueeze(-1).float()  # (B, S, 1): the token ids as states
    for original, m, piece in zip(toks, masks, split_sources(features, masks)):
        assert torch.equal(piece.squeeze(-1).long()[m], original[m])


def test_single_source_sampling_is_uniform():
    corpus = synthetic_corpus(3000, num_sources=3, seed=0)
    sampled = sample_single_source(corpus, seed=1)
    picks = [[corpus.sources[k][i] for k in range(3)].index(s) for i, s in enumerate(sampled.sources[0])]
    for k in range(3):
        assert abs(picks.count(k) / len(picks) - 1 / 3) < 0.03
    assert sampled.target == corpus.target


def test_ffn_adapter_variant_adds_only_new_adapter_parameters():
    torch.manual_seed(0)
    single = TriceTransformer(TriceConfig(**DIMS, fine_layers=0))
    model = from_single_source(single, TriceConfig(**DIMS, fine_layers=0, encoder_adapters=True)).eval()
    new = model.new_parameter_names()
    assert new and all(".adapter" in name for name in new)
    assert len(new) == 6 * DIMS["encoder_layers"]  # adapter w1, b1, w2, b2 and adapter_norm weight, bias
    toks, masks = sources(2)
    assert model.encode(toks, masks)[0].hidden.shape == (3, 5, DIMS["d_model"])
    rest, adapters = model.parameter_groups()
    assert adapters["lr_scale"] == model.cfg.fine_lr / model.cfg.base_lr and len(adapters["params"]) == len(new)


def test_cross_source_attention_weights_are_distributions_over_the_other_sources():
    toks, masks = sources(3)
    weights = trice(fine_layers=2).cross_source_attention(toks, masks)
    assert len(weights) == 2 and len(weights[0]) == 3
    w = weights[0][0]  # source 0 attends to sources 1 and 2: (B, H, S_0, S_1 + S_2)
    assert w.shape == (3, DIMS["n_heads"], 5, 7 + 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    others_mask = torch.cat([masks[1], masks[2]], 1)
    assert w[0, :, :, ~others_mask[0]].abs().max() == 0  # padding of the other sources gets no weight
    with pytest.raises(ValueError, match="no fine encoder"):
        trice(fine_layers=0).cross_source_attention(toks, masks)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_fine_cross_attention_reads_the_other_sources_self_attention_outputs_as_eq_12(pre_norm):
    """Eq. (11-13): keys and values are B_j (the other sources after this layer's self-attention), not A_j^(i-1)."""
    torch.manual_seed(0)
    model = trice(fine_layers=2, pre_norm=pre_norm)
    layer = model.fine_encoder.layers[1]
    seen = []
    layer.cross_attn.register_forward_pre_hook(lambda module, args: seen.append(args[1]))
    toks, masks = sources(2)
    states = [torch.randn(3, n, 32) for n in (5, 7)]
    layer(states, masks)
    others = layer.self_attend(states[1], masks[1])  # B_1, what source 0 must read
    torch.testing.assert_close(seen[0], layer.before(others, layer.cross_attn_norm))
    assert not torch.allclose(seen[0], layer.before(states[1], layer.cross_attn_norm), atol=1e-3)


def test_one_long_sequence_has_continuous_positions_and_the_trice_encoder_restarts_them():
    toks, masks = sources(2)
    seen = {}

    def recording(forward, restart):
        def wrapped(*args, **kwargs):
            seen[restart] = kwargs["positions"]
            return forward(*args, **kwargs)
        return wrapped

    for restart in (True, False):
        model = trice(fine_layers=0, restart_positions=restart, segment_embedding=False)
        model.encoder.forward = recording(model.encoder.forward, restart)
        model.coarse_encode(toks, masks)
    lengths = [int(m[1].sum()) for m in masks]  # sentence 1 has no padding
    assert seen[True][1].tolist() == list(range(lengths[0])) + list(range(lengths[1]))
    assert seen[False][1].tolist() == list(range(sum(lengths)))
    n = int(masks[0][0].sum() + masks[1][0].sum())  # sentence 0: padding at the end gets position 0
    assert seen[False][0, :n].tolist() == list(range(n)) and not seen[False][0, n:].any()


def test_fine_layers_without_cross_attention_build_no_cross_attention_parameters():
    with_ca = {n for n, _ in trice(fine_layers=1).fine_encoder.named_parameters()}
    without = {n for n, _ in trice(fine_layers=1, fine_cross_attention=False).fine_encoder.named_parameters()}
    assert without == {n for n in with_ca if "cross_attn" not in n} and without != with_ca
