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

def test_coverage_agreement_is_zero_for_the_source_bag_and_positive_otherwise():
    torch.manual_seed(0)
    V, D = 20, 16
    embedding = torch.randn(V, D)
    projection = nn.Linear(D, D, bias=False)
    src = torch.tensor([[5, 7, 9, 3], [4, 4, 6, 0]])
    src_mask = src != 0
    probs = nn.functional.one_hot(src, V).float()  # p_t reproduces the source, same length
    same = coverage_agreement(src, src_mask, probs, src_mask, embedding, embedding, projection)
    torch.testing.assert_close(same, torch.zeros(2), atol=1e-6, rtol=0)
    reordered = probs.flip(1)  # a bag of words ignores order (the padding moves with the mask)
    assert coverage_agreement(src, src_mask, reordered, src_mask.flip(1), embedding, embedding,
                              projection).max() < 1e-5
    other = nn.functional.one_hot(torch.tensor([[5, 7, 9, 9], [4, 11, 6, 0]]), V).float()
    assert (coverage_agreement(src, src_mask, other, src_mask, embedding, embedding, projection) > 1e-3).all()
    soft = torch.softmax(torch.randn(2, 4, V), -1)
    assert (coverage_agreement(src, src_mask, soft, src_mask, embedding, embedding, projection) > 1e-3).all()


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

def test_iterations_matter_only_with_coverage_and_nonzero_lambda():
    tokens, mask = source_batch()
    target_mask = lengths_mask([4, 6, 5])
    model = nat(coverage_scale_init=3.0)
    assert isinstance(model.decoder.layers[-1], CoverageDecoderLayer)
    one, three = (decoded(model, tokens, mask, target_mask, k) for k in (1, 3))
    assert not torch.allclose(one, three, atol=1e-4)
    with torch.no_grad():
        model.decoder.layers[-1].coverage_scale.zero_()
    torch.testing.assert_close(decoded(model, tokens, mask, target_mask, 1),
                               decoded(model, tokens, mask, target_mask, 3))
    base = nat(use_coverage=False)
    assert type(base.decoder.layers[-1]) is NATDecoderLayer
    torch.testing.assert_close(decoded(base, tokens, mask, target_mask, 1), decoded(base, tokens, mask, target_mask, 3))
    # lambda = 0: the coverage layer is exactly the plain layer with the same weights
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    assert missing == ["decoder.layers.1.coverage_scale"] and not unexpected
    torch.testing.assert_close(decoded(model, tokens, mask, target_mask, 2),
                               decoded(base, tokens, mask, target_mask))


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
    for _ in range(150):
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
