"""Coverage-NAT (msgcore/models/coverage_nat.py): coverage, non-causality, lengths, SCA, decoding."""
import pytest
import torch
from torch import nn

from msgcore.batching import collate, encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.models.coverage_nat import (CoverageDecoderLayer, CoverageNAT, CoverageNATConfig, NATDecoderLayer,
                                         class_to_offset, coverage, coverage_agreement, generate_lpd, generate_nat,
                                         lpd_candidates, offset_to_class, remove_consecutive_repeats, repeat_ratio)
from msgcore.tokenizer import Tokenizer
from msgcore.utils import MsgcoreError

DIMS = dict(vocab_size=40, d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0,
            max_length_offset=8)


def nat(**overrides):
    torch.manual_seed(0)
    return CoverageNAT(CoverageNATConfig(**{**DIMS, **overrides})).eval()


def source_batch(B=3, S=7):
    """Random sources (B, S); sentence 0 has two padded positions."""
    tokens = torch.randint(4, 40, (B, S))
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[0, S - 2:] = False
    return tokens.masked_fill(~mask, 0), mask


def lengths_mask(lengths, T=None):
    lengths = torch.tensor(lengths)
    return torch.arange(T or int(lengths.max())) < lengths[:, None]  # (B, T)


def decoded(model, tokens, mask, target_mask, iterations=None):
    return model.decode(target_mask, model.encode([tokens], [mask]), iterations).logits


# ---- 1. coverage --------------------------------------------------------------------------------

def test_coverage_matches_a_python_loop():
    B, T, S = 2, 6, 4
    attention = torch.rand(B, T, S) * 0.6  # sums over t' cross 1 for some (t, i): the clip matters
    target_mask = lengths_mask([6, 4])
    got = coverage(attention, target_mask)
    for b in range(B):
        for t in range(T):
            for i in range(S):
                total = sum(attention[b, u, i].item() for u in range(t) if target_mask[b, u])
                assert got[b, t, i].item() == pytest.approx(min(total, 1.0), abs=1e-6)
    assert torch.equal(got[:, 0], torch.zeros(B, S))
    assert (got == 1.0).any() and (got < 1.0).any()


# ---- 2. non-causal decoder, padding invariance ------------------------------------------------------

@pytest.mark.parametrize("use_coverage", [True, False])
def test_decoder_is_not_causal(use_coverage):
    model = nat(use_coverage=use_coverage)
    tokens, mask = source_batch()
    target_mask = lengths_mask([5, 5, 5])
    base = decoded(model, tokens, mask, target_mask)

    def perturb_last(module, inputs, output):
        output = output.clone()
        output[:, -1] += torch.randn(output.size(-1))  # not a constant shift, which LayerNorm removes
        return output

    handle = model.decoder.embed.register_forward_hook(perturb_last)
    moved = decoded(model, tokens, mask, target_mask)
    handle.remove()
    assert not torch.allclose(moved[:, 0], base[:, 0], atol=1e-4)  # position 0 sees position T-1


@pytest.mark.parametrize("use_coverage", [True, False])
def test_padding_does_not_change_real_positions(use_coverage):
    model = nat(use_coverage=use_coverage)
    tokens, mask = source_batch()
    target_mask = lengths_mask([3, 5, 4])
    base = decoded(model, tokens, mask, target_mask)
    # padded source tokens
    changed = tokens.clone()
    changed[~mask] = torch.randint(4, 40, (int((~mask).sum()),))
    torch.testing.assert_close(decoded(model, changed, mask, target_mask)[target_mask], base[target_mask])
    # padded target positions: more of them, and different inputs there
    wider = lengths_mask([3, 5, 4], T=8)

    def perturb_padding(module, inputs, output):
        return output + 5.0 * (~wider).unsqueeze(-1)

    handle = model.decoder.embed.register_forward_hook(perturb_padding)
    padded = decoded(model, tokens, mask, wider)
    handle.remove()
    torch.testing.assert_close(padded[:, :5][target_mask], base[target_mask])
    # the length prediction ignores padded source tokens as well
    memory = model.encode([changed], [mask])[0]
    torch.testing.assert_close(model.length_logits(memory), model.length_logits(model.encode([tokens], [mask])[0]))


# ---- 3. length classes -----------------------------------------------------------------------------

def test_the_coverage_attention_scales_its_logits_by_sqrt_d_model_as_eq_9():
    """Eq. (9): softmax(H E^T / sqrt(d_model) + λ B). Each head's logits are divided by sqrt(d_model), not by
    sqrt(d_head) as in the other attention layers; the bias is added after the scaling, to every head."""
    from msgcore.models.coverage_nat import CoverageCrossAttention

    torch.manual_seed(0)
    attention = CoverageCrossAttention(32, 4, 0.0).eval()
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 6, 32)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    bias = torch.randn(2, 5, 6)
    _, weights = attention(x, memory, mask, bias)
    q = attention.split_heads(attention.q_proj(x))  # (B, H, T, 8)
    k, _ = attention.keys_values(x, memory, None)
    by_hand = torch.softmax(q @ k.transpose(-2, -1) / 32 ** 0.5 + bias.unsqueeze(1), dim=-1).mean(1)
    torch.testing.assert_close(weights, by_hand)
    per_head = torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5 + bias.unsqueeze(1), dim=-1).mean(1)
    assert (weights - per_head).abs().max() > 1e-3  # sqrt(d_head) would be another attention


def test_length_offset_classes_round_trip_and_clip():
    m = 128
    offsets = torch.arange(-m, m + 1)
    classes = offset_to_class(offsets, m)
    assert torch.equal(classes, torch.arange(2 * m + 1))
    assert torch.equal(class_to_offset(classes, m), offsets)
    assert offset_to_class(torch.tensor([-500, -129, 129, 500]), m).tolist() == [0, 0, 256, 256]
    model = nat(max_length_offset=m)
    assert model.length_predictor.out_features == 257


def test_predicted_lengths_are_at_least_one():
    model = nat(max_length_offset=8)
    with torch.no_grad():
        model.length_predictor.bias.fill_(0.0)
        model.length_predictor.bias[0] = 100.0  # always offset -8
    tokens, mask = source_batch()
    lengths = model.predict_lengths(model.encode([tokens], [mask])[0])
    assert lengths.tolist() == [1, 1, 1]


# ---- 4. sentence-level coverage agreement -------------------------------------------------------------

def test_coverage_agreement_equals_eq_11_to_14_by_hand_and_does_not_project_the_hypothesis():
    torch.manual_seed(0)
    V, D = 6, 4
    E = torch.randn(V, D)  # source embedding
    W_e = torch.randn(V, D)  # target embedding
    projection = nn.Linear(D, D, bias=False)
    src = torch.tensor([[1, 2, 3], [4, 5, 0]])
    src_mask = src != 0
    probs = torch.softmax(torch.randn(2, 2, V), -1)
    tgt_mask = torch.tensor([[True, True], [True, False]])
    got = coverage_agreement(src, src_mask, probs, tgt_mask, E, W_e, projection)
    W_s = projection.weight.T  # Linear computes x @ weight.T
    for b in range(2):
        n = int(src_mask[b].sum())
        e_src = sum(torch.relu(E[src[b, i]] @ W_s) for i in range(n)) / n  # Eq. (11)
        T = int(tgt_mask[b].sum())
        e_hyp = sum(probs[b, t] @ W_e for t in range(T)) / T  # Eq. (12-13): no projection, no ReLU
        expected = torch.sqrt(((e_src - e_hyp) ** 2).sum()) / D ** 0.5  # Eq. (14)
        assert got[b].item() == pytest.approx(expected.item(), rel=1e-5)
    # W_s acts on the source only: collapsing it leaves ||E_hyp|| / sqrt(d), not zero
    with torch.no_grad():
        projection.weight.zero_()
    collapsed = coverage_agreement(src, src_mask, probs, tgt_mask, E, W_e, projection)
    e_hyp = torch.stack([(probs[b, :int(tgt_mask[b].sum())] @ W_e).mean(0) for b in range(2)])
    torch.testing.assert_close(collapsed, e_hyp.norm(dim=-1) / D ** 0.5)
    assert (collapsed > 1e-3).all()
    # a hypothesis whose expected embedding is the projected source bag gives zero
    with torch.no_grad():
        projection.weight.copy_(torch.eye(D))
    positive = E.abs()  # ReLU(E I) = E for non-negative embeddings
    one_hot = nn.functional.one_hot(src, V).float()
    same = coverage_agreement(src, src_mask, one_hot, src_mask, positive, positive, projection)
    torch.testing.assert_close(same, torch.zeros(2), atol=1e-6, rtol=0)


def test_loss_parts_and_weights():
    model = nat(coverage_weight=0.5).train()
    tokens, mask = source_batch()
    target = torch.randint(4, 40, (3, 5))
    target_mask = lengths_mask([3, 5, 4], T=5)
    batch = type("B", (), dict(sources=[tokens], source_masks=[mask], target_mask=target_mask,
                               target_out=target.masked_fill(~target_mask, 0)))()
    parts = model.loss_terms(batch)
    assert set(parts) == {"mle", "length", "coverage", "total"}
    expected = parts["mle"] + 0.1 * parts["length"] + 0.5 * parts["coverage"]
    torch.testing.assert_close(parts["total"], expected)
    assert all(parts[k] > 0 for k in ("mle", "length", "coverage"))
    parts["total"].backward()
    assert model.bag_projection.weight.grad.abs().sum() > 0
    assert model.decoder.layers[-1].coverage_scale.grad is not None
    assert model(batch).shape == (3, 5, 40)
    phase1 = nat(coverage_weight=0.0).train()
    phase1.loss_terms(batch)["total"].backward()
    assert phase1.bag_projection.weight.grad is None  # beta = 0: SCA is only logged


# ---- 5. post-processing -----------------------------------------------------------------------------

def test_remove_consecutive_repeats_and_repeat_ratio():
    assert remove_consecutive_repeats([5, 5, 6, 6, 6, 5, 7]) == [5, 6, 5, 7]
    assert remove_consecutive_repeats([]) == [] and remove_consecutive_repeats([4]) == [4]
    outputs = [[5, 5, 6, 6, 6], [7, 8, 7], []]  # 3 repeats among 8 tokens
    assert repeat_ratio(outputs) == pytest.approx(100 * 3 / 8)
    assert repeat_ratio([[1, 2, 3]]) == 0.0 and repeat_ratio([]) == 0.0
    assert repeat_ratio([remove_consecutive_repeats(o) for o in outputs]) == 0.0


def test_lpd_candidates():
    assert lpd_candidates(torch.tensor([10, 2, 1]), 3).tolist() == [[9, 10, 11], [1, 2, 3], [1, 2, 3]]
    assert lpd_candidates(torch.tensor([10]), 4).tolist() == [[9, 10, 11, 12]]
    assert lpd_candidates(7, 1).tolist() == [7]


# ---- 6. iterations, lambda and NAT-Base ------------------------------------------------------------------

def test_tcir_iterations_are_chained():
    """Each iteration runs self-attention, cross-attention and FFN on the previous iteration's output (Eq. 7-10)."""
    tokens, mask = source_batch()
    target_mask = lengths_mask([4, 6, 5])
    model = nat()
    layer = model.decoder.layers[-1]
    assert isinstance(layer, CoverageDecoderLayer)
    outputs = {k: decoded(model, tokens, mask, target_mask, k) for k in (1, 3, 5)}
    assert not torch.allclose(outputs[3], outputs[5], atol=1e-4)  # K_dec = 3 and 5 differ
    assert not torch.allclose(outputs[1], outputs[3], atol=1e-4)
    # iteration k's input (what its self-attention normalises) is iteration k-1's output H^{k-1}
    inputs, states = [], []
    handle = layer.self_attn_norm.register_forward_hook(lambda m, args, out: inputs.append(args[0].detach()))
    memory = model.encode([tokens], [mask])
    below = model.decoder.inputs(target_mask, memory[0])
    self_mask = target_mask[:, None, None, :]
    with torch.no_grad():
        h0, a0 = model.decoder.layers[0](below, memory, self_mask, True)
        h_k, _ = layer(h0, memory, self_mask, target_mask, a0.mean(1), 3, states=states)
    handle.remove()
    assert len(inputs) == 3 and len(states) == 3
    torch.testing.assert_close(inputs[0], h0)
    torch.testing.assert_close(inputs[1], states[0])
    torch.testing.assert_close(inputs[2], states[1])
    torch.testing.assert_close(h_k, states[2])
    # with lambda = 0, the iterations still differ (they are chained), and K = 1 is the plain layer
    with torch.no_grad():
        layer.coverage_scale.zero_()
    assert not torch.allclose(decoded(model, tokens, mask, target_mask, 1),
                              decoded(model, tokens, mask, target_mask, 3), atol=1e-4)
    base = nat(use_coverage=False)
    assert type(base.decoder.layers[-1]) is NATDecoderLayer
    torch.testing.assert_close(decoded(base, tokens, mask, target_mask, 1), decoded(base, tokens, mask, target_mask, 3))
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert missing == ["decoder.layers.1.coverage_scale"] and not unexpected
    # with one head, sqrt(d_model) is sqrt(d_head): K = 1 at lambda = 0 is then exactly the plain layer
    one_head, one_head_base = nat(n_heads=1), nat(n_heads=1, use_coverage=False)
    one_head.load_state_dict(one_head_base.state_dict(), strict=False)
    with torch.no_grad():
        one_head.decoder.layers[-1].coverage_scale.zero_()
    torch.testing.assert_close(decoded(one_head, tokens, mask, target_mask, 1),
                               decoded(one_head_base, tokens, mask, target_mask))


def test_uniform_copy_inputs_are_the_source_embeddings_at_round_i_s_over_t():
    model = nat()
    tokens, mask = source_batch(B=3, S=7)  # real source lengths 5, 7, 7
    target_mask = lengths_mask([4, 9, 3], T=9)
    memory = model.encode([tokens], [mask])
    got = model.decoder.inputs(target_mask, memory[0])  # (B, T, D), dropout 0 in eval
    embed = model.decoder.embed
    for b in range(3):
        S, T = int(mask[b].sum()), int(target_mask[b].sum())
        for i in range(T):
            j = min(int(i * S / T + 0.5), S - 1)
            expected = embed.scale * embed.tokens.weight[tokens[b, j]] + embed.positions.table[i]
            torch.testing.assert_close(got[b, i], expected)
    assert model.decoder.input_tokens(target_mask, memory[0])[~target_mask].eq(0).all()  # padding gets <pad>
    # the paper's <unk> inputs: every position the same vector but for its position encoding
    unk = nat(decoder_input="unk")
    x = unk.decoder.inputs(target_mask, unk.encode([tokens], [mask])[0])
    torch.testing.assert_close(x[1] - unk.decoder.embed.positions.table[:9],
                               (unk.decoder.embed.scale * unk.decoder.embed.tokens.weight[unk.cfg.unk_id]).expand(9, -1))
    with pytest.raises(MsgcoreError, match="decoder_input"):
        nat(decoder_input="soft")


def test_nat_loss_uses_the_trainers_label_smoothing():
    model = nat().eval()
    tokens, mask = source_batch()
    target_mask = lengths_mask([3, 5, 4], T=5)
    target = torch.randint(4, 40, (3, 5)).masked_fill(~target_mask, 0)
    batch = type("B", (), dict(sources=[tokens], source_masks=[mask], target_mask=target_mask, target_out=target))()
    plain, smoothed = model.loss_terms(batch, 0.0)["mle"], model.loss_terms(batch, 0.1)["mle"]
    assert abs(plain.item() - smoothed.item()) > 1e-4
    with torch.no_grad():
        logp = torch.log_softmax(model(batch).float(), -1)[target_mask]  # (N, V) real positions
    nll = -logp.gather(1, target[target_mask][:, None]).squeeze(1)
    uniform = -logp.mean(1)
    assert smoothed.item() == pytest.approx((0.9 * nll + 0.1 * uniform).mean().item(), rel=1e-5)
    assert plain.item() == pytest.approx(nll.mean().item(), rel=1e-5)
    # the Trainer's hook passes its epsilon through
    n = target_mask.sum()
    assert (model.loss(batch, 0.1) / n).item() == pytest.approx(model.loss_terms(batch, 0.1)["total"].item(), rel=1e-5)
    assert abs((model.loss(batch, 0.1) - model.loss(batch, 0.0)).item()) > 1e-4


def test_coverage_needs_a_layer_below():
    with pytest.raises(MsgcoreError, match="decoder_layers >= 2"):
        nat(decoder_layers=1)
    nat(decoder_layers=1, use_coverage=False)


# ---- 7. a tiny model overfits ---------------------------------------------------------------------

def test_tiny_model_overfits_and_generates(tmp_path):
    corpus = synthetic_corpus(16, num_sources=1)
    tokenizer = Tokenizer.train(corpus.texts(), vocab_size=60, cache_dir=tmp_path)
    encoded = encode_corpus(corpus, tokenizer)
    batch = collate(encoded, range(len(encoded)))
    torch.manual_seed(0)
    model = CoverageNAT(CoverageNATConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, d_ff=64,
                                          encoder_layers=2, decoder_layers=2, dropout=0.0,
                                          max_length_offset=16, coverage_iterations=2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(80):
        model.train()
        loss = model.loss_terms(batch)["total"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    outputs = generate_nat(model, batch.sources, batch.source_masks, iterations=2)
    targets = encoded.target
    correct = sum(sum(a == b for a, b in zip(out, ref)) for out, ref in zip(outputs, targets))
    accuracy = correct / sum(max(len(out), len(ref)) for out, ref in zip(outputs, targets))
    assert accuracy > 0.9, (accuracy, outputs[:3], targets[:3])
    candidates = generate_lpd(model, batch.sources, batch.source_masks, l=3)
    assert len(candidates) == 16 and all(len(c) == 3 for c in candidates)
    assert sum(c[1] == out for c, out in zip(candidates, outputs)) == 16  # the middle one is the prediction


def test_trainer_hook_sums_the_total_over_target_tokens(tmp_path):
    """The Trainer divides the model's `loss` by the token count: that must give back `total`."""
    corpus = synthetic_corpus(6, num_sources=1, seed=0)
    tok = Tokenizer.train(corpus.texts(), vocab_size=60, cache_dir=tmp_path)
    batch = collate(encode_corpus(corpus, tok), range(6))
    torch.manual_seed(0)
    model = CoverageNAT(CoverageNATConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ff=64,
                                          encoder_layers=1, decoder_layers=2, dropout=0.0)).eval()
    summed = model.loss(batch) / batch.num_target_tokens
    torch.testing.assert_close(summed, model.loss_terms(batch)["total"])


def test_trainer_validates_a_nat_model_through_its_generate_hook(tmp_path):
    """translate_encoded (dev BLEU, the CLI) calls model.generate: for a NAT model, parallel decoding."""
    from msgcore.trainer import Trainer, TrainConfig, translate_encoded
    from msgcore.generation import GenerationConfig

    corpus = synthetic_corpus(24, num_sources=1, seed=0)
    tok = Tokenizer.train(corpus.texts(), vocab_size=60, cache_dir=tmp_path)
    encoded = encode_corpus(corpus, tok)
    torch.manual_seed(0)
    model = CoverageNAT(CoverageNATConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ff=64,
                                          encoder_layers=1, decoder_layers=2, dropout=0.0, max_length_offset=16))
    cfg = TrainConfig(lr=3e-3, warmup_steps=2, max_tokens=400, max_epochs=2, patience=0, log_every=1, progress=False)
    history = Trainer(model, tok, encoded, encoded, corpus.target, cfg, torch.device("cpu"), tmp_path / "run").train()
    assert [r["epoch"] for r in history if r["kind"] == "valid"] == [1, 2]
    hyps = translate_encoded(model, tok, encoded, torch.device("cpu"), GenerationConfig(beam_size=4))
    batch = collate(encoded, range(len(encoded)))
    expected = [tok.decode(ids) for ids in generate_nat(model, batch.sources, batch.source_masks,
                                                         forbidden=[tok.pad_id, tok.bos_id])]
    assert hyps == expected
