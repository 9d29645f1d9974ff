"""POSTECH APE (Lee, Shin, Lee, WMT 2019): joint encoder, multi-source decoder attention, teacher-forcing
ratio, ensembles. Tiny configs; each test runs in seconds on one CPU thread."""
import math

import pytest
import torch
import torch.nn.functional as F

from msgcore.batching import Batch, collate, encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.generation import Ensemble, GenerationConfig, generate, greedy_search, step_log_probs
from msgcore.models import MODELS
from msgcore.models.postech_ape import (ParallelAttentionLayer, PostechAPE, PostechConfig,
                                        SequentialAttentionLayer)
from msgcore.tokenizer import Tokenizer
from msgcore.utils import MsgcoreError

torch.set_num_threads(1)
V, PAD, BOS, EOS = 40, 0, 2, 3


def postech(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=V, d_model=32, n_heads=4, d_ff=64, encoder_layers=3, decoder_layers=2, dropout=0.0)
    return PostechAPE(PostechConfig(**{**cfg, **overrides})).eval()


def padded(lengths, vocab=V, extra=0):
    """(B, max(lengths) + extra) random tokens >= 4 with right padding, and the mask."""
    T = max(lengths) + extra
    tokens = torch.randint(4, vocab, (len(lengths), T))
    mask = torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return tokens.masked_fill(~mask, PAD), mask


def src_mt(src_lengths=(9, 4, 6), mt_lengths=(3, 8, 5)):
    """Uneven lengths on purpose: src longer than mt in one row, shorter in another."""
    torch.manual_seed(1)
    (src, src_mask), (mt, mt_mask) = padded(src_lengths), padded(mt_lengths)
    return [src, mt], [src_mask, mt_mask]


def encoder_trace(model, sources, masks):
    """Inputs and outputs of every src and mt encoder layer, and mt layer i's src argument."""
    trace = {"src_out": {}, "mt_in": {}, "mt_out": {}, "mt_src_arg": {}}
    hooks = []
    for i, layer in enumerate(model.encoder.src_layers):
        hooks.append(layer.register_forward_hook(lambda m, a, out, i=i: trace["src_out"].__setitem__(i, out[0])))
    for i, layer in enumerate(model.encoder.mt_layers):
        def hook(m, args, out, i=i):
            trace["mt_in"][i], trace["mt_src_arg"][i], trace["mt_out"][i] = args[0], args[2], out[0]
        hooks.append(layer.register_forward_hook(hook))
    model.encode(sources, masks)
    for h in hooks:
        h.remove()
    return trace


# ---- §2.1 the joint encoder ------------------------------------------------------------------------

@pytest.mark.parametrize("pre_norm", [False, True])
def test_mt_layer_i_attends_to_src_layer_i(pre_norm):
    """Stack-level attention: mt layer i's keys/values are src layer i's output, not the top src layer's."""
    model, (sources, masks) = postech(pre_norm=pre_norm), src_mt()
    base = encoder_trace(model, sources, masks)
    for i in range(3):
        torch.testing.assert_close(base["mt_src_arg"][i], base["src_out"][i], rtol=0, atol=0)
    # Perturb the weights of src layer j: mt layers below j do not change, mt layer j does.
    for j in range(3):
        perturbed = postech(pre_norm=pre_norm)
        with torch.no_grad():
            for p in perturbed.encoder.src_layers[j].parameters():
                p.add_(0.5 * torch.randn_like(p))
        trace = encoder_trace(perturbed, sources, masks)
        for i in range(j):
            torch.testing.assert_close(trace["mt_out"][i], base["mt_out"][i], rtol=0, atol=0)
        assert not torch.allclose(trace["mt_out"][j], base["mt_out"][j], atol=1e-3)
    # Perturb src layer j's output (a hook): again only mt layers >= j see it.
    noise = torch.randn(3, sources[0].size(1), 32)  # (B, T_x, D), not a constant (LayerNorm would remove it)
    for j in range(3):
        hook = model.encoder.src_layers[j].register_forward_hook(lambda m, a, out: (out[0] + noise, out[1]))
        trace = encoder_trace(model, sources, masks)
        hook.remove()
        for i in range(j):
            torch.testing.assert_close(trace["mt_out"][i], base["mt_out"][i], rtol=0, atol=0)
        assert not torch.allclose(trace["mt_out"][j], base["mt_out"][j], atol=1e-3)


def test_mt_layers_are_chained():
    """mt layer i reads mt layer i-1's output (the reimplementation fed every layer the embeddings)."""
    model, (sources, masks) = postech(), src_mt()
    trace = encoder_trace(model, sources, masks)
    torch.testing.assert_close(trace["mt_in"][0], model.encoder.embed(sources[1]), rtol=0, atol=0)
    for i in (1, 2):
        torch.testing.assert_close(trace["mt_in"][i], trace["mt_out"][i - 1], rtol=0, atol=0)
    with torch.no_grad():  # changing mt layer 0 changes every later mt layer
        for p in model.encoder.mt_layers[0].parameters():
            p.add_(0.5 * torch.randn_like(p))
    later = encoder_trace(model, sources, masks)
    assert not torch.allclose(later["mt_out"][2], trace["mt_out"][2], atol=1e-3)
    torch.testing.assert_close(later["src_out"][2], trace["src_out"][2], rtol=0, atol=0)  # src does not read mt


@pytest.mark.parametrize("multi_source", ["parallel", "sequential"])
@pytest.mark.parametrize("mt_future_mask", [False, True])
def test_padding_never_changes_outputs_with_uneven_lengths(multi_source, mt_future_mask):
    """Extra src (or mt) padding changes nothing; the src mask follows the src length, whatever mt's."""
    model = postech(multi_source=multi_source, mt_future_mask=mt_future_mask)
    src_lengths, mt_lengths = (9, 4, 6), (3, 8, 5)
    torch.manual_seed(1)
    (src, src_mask), (mt, mt_mask) = padded(src_lengths), padded(mt_lengths)
    target = torch.randint(4, V, (3, 6))
    reference = model.decode(target, model.encode([src, mt], [src_mask, mt_mask])).logits
    for extra_src, extra_mt in ((5, 0), (0, 5), (3, 7)):
        src2 = F.pad(src, (0, extra_src), value=PAD)
        mt2 = F.pad(mt, (0, extra_mt), value=PAD)
        memory = model.encode([src2, mt2], [src2 != PAD, mt2 != PAD])
        torch.testing.assert_close(model.decode(target, memory).logits, reference, rtol=1e-5, atol=1e-5)
    # Row by row (no padding at all) gives the same as the padded batch.
    memory = model.encode([src, mt], [src_mask, mt_mask])
    for b in range(3):
        one = model.encode([src[b:b + 1, :src_lengths[b]], mt[b:b + 1, :mt_lengths[b]]],
                           [src_mask[b:b + 1, :src_lengths[b]], mt_mask[b:b + 1, :mt_lengths[b]]])
        torch.testing.assert_close(one[1].hidden[0], memory[1].hidden[b, :mt_lengths[b]], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(one[0].hidden[0], memory[0].hidden[b, :src_lengths[b]], rtol=1e-5, atol=1e-5)
    # The stack-level attention spans the src length and gives src padding no weight.
    for weights in model.stack_attention([src, mt], [src_mask, mt_mask]):
        assert weights.shape == (3, 4, mt.size(1), src.size(1))
        assert weights.masked_select(~src_mask[:, None, None, :].expand_as(weights)).abs().max() == 0


@pytest.mark.parametrize("pre_norm", [False, True])
def test_mt_future_mask_hides_later_mt_tokens_in_every_layer(pre_norm):
    sources, masks = src_mt((5, 5, 5), (6, 6, 6))
    changed = sources[1].clone()
    changed[:, 4] = (changed[:, 4] + 1 - 4) % (V - 4) + 4  # change mt token 4
    for mask_on in (True, False):
        model = postech(mt_future_mask=mask_on, pre_norm=pre_norm)
        before = model.encode(sources, masks)[1].hidden
        after = model.encode([sources[0], changed], masks)[1].hidden
        same_prefix = torch.allclose(before[:, :4], after[:, :4], atol=1e-6)
        assert same_prefix == mask_on  # with the mask, E_joint[:, :4] never sees mt token 4 (3 layers deep)


# ---- §2.2 the decoder's multi-source attention ----------------------------------------------------

def mha(attn, query, memory, mask):
    """MultiHead(Q, K, V) written out from the module's weights, mask (B, S) True = real key."""
    B, T, D = query.shape
    H = attn.n_heads

    def heads(x):
        return x.view(B, -1, H, D // H).transpose(1, 2)

    q, k, v = heads(attn.q_proj(query)), heads(attn.k_proj(memory)), heads(attn.v_proj(memory))
    scores = (q @ k.transpose(-1, -2) / math.sqrt(D // H)).masked_fill(~mask[:, None, None, :], float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
    return attn.out_proj(out)


def memory_pair():
    from msgcore.layers import EncoderOut
    torch.manual_seed(2)
    src_mask = torch.tensor([[True] * 7, [True] * 3 + [False] * 4])
    mt_mask = torch.tensor([[True] * 2 + [False] * 3, [True] * 5])
    return [EncoderOut(torch.randn(2, 7, 16), src_mask), EncoderOut(torch.randn(2, 5, 16), mt_mask)]


@pytest.mark.parametrize("pre_norm", [False, True])
def test_parallel_and_sequential_equal_their_formulas_and_differ(pre_norm):
    torch.manual_seed(3)
    parallel = ParallelAttentionLayer(16, 4, 32, 0.0, 0.0, 0.0, pre_norm).eval()
    sequential = SequentialAttentionLayer(16, 4, 32, 0.0, 0.0, 0.0, pre_norm).eval()
    for layer in (parallel, sequential):  # non-trivial norms, so that each LayerNorm is visible
        for norm in (layer.cross_attn_norm, layer.src_attn_norm):
            norm.weight.data.uniform_(0.5, 1.5)
            norm.bias.data.normal_()
    sequential.load_state_dict(parallel.state_dict())  # the same weights: only the wiring differs
    e_src, e_joint = memory = memory_pair()
    x = torch.randn(2, 4, 16)  # H_pe
    ln_j, ln_s = parallel.cross_attn_norm, parallel.src_attn_norm
    c_joint = lambda q: mha(parallel.cross_attn, q, e_joint.hidden, e_joint.mask)  # noqa: E731
    c_src = lambda q: mha(parallel.src_attn, q, e_src.hidden, e_src.mask)  # noqa: E731
    with torch.no_grad():
        if pre_norm:
            expected_par = x + c_joint(ln_j(x)) + c_src(ln_s(x))
            h = x + c_joint(ln_j(x))
            expected_seq = h + c_src(ln_s(h))
        else:
            expected_par = ln_j(x + c_joint(x)) + ln_s(x + c_src(x))  # H_1 + H_2
            h = ln_j(x + c_joint(x))  # H'
            expected_seq = ln_s(h + c_src(h))  # H_seq
        got_par, kv_par, _ = parallel.cross_block(x, memory, None, False)
        got_seq, kv_seq, _ = sequential.cross_block(x, memory, None, False)
    torch.testing.assert_close(got_par, expected_par, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_seq, expected_seq, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got_par, got_seq, atol=1e-2)
    assert len(kv_par) == len(kv_seq) == 2 and kv_par[0][0].shape[2] == 7 and kv_par[1][0].shape[2] == 5
    # The weights cover both sources, in memory order [E_src (7), E_joint (5)].
    with torch.no_grad():
        _, _, w = sequential.cross_block(x, memory, None, True)
    assert w.shape == (2, 4, 4, 12)


@pytest.mark.parametrize("multi_source", ["parallel", "sequential"])
@pytest.mark.parametrize("pre_norm", [False, True])
def test_incremental_decoding_equals_full(multi_source, pre_norm):
    model, (sources, masks) = postech(multi_source=multi_source, pre_norm=pre_norm, mt_future_mask=True), src_mt()
    memory = model.encode(sources, masks)
    target = torch.randint(4, V, (3, 7))
    full = model.decode(target, memory).logits
    cache, steps = None, []
    for t in range(7):
        out = model.decode(target[:, t:t + 1], memory, cache, start_pos=t)
        cache = out.cache
        assert all(len(layer.cross_kv) == 2 for layer in cache)  # one (k, v) per source
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    hyps = generate(model, sources, masks, BOS, EOS, GenerationConfig(beam_size=3, max_len_b=5))
    assert len(hyps) == 3


# ---- §3.2 the teacher-forcing ratio ---------------------------------------------------------------

def batch_of(B=3, T=7):
    """A Batch of B random (src, mt) -> pe examples with uneven src/mt/pe lengths (pe at most T - 1 tokens)."""
    torch.manual_seed(1)
    (src, src_mask), (mt, mt_mask) = padded([4 + 5 * (b % 2) for b in range(B)]), padded([3 + b % 6 for b in range(B)])
    lengths = [T - b % 3 for b in range(B)]  # |y| + 1
    y, mask = padded([n - 1 for n in lengths])
    target_in = torch.cat([torch.full((B, 1), BOS), y], 1)  # (B, T)
    target_out = torch.cat([y, torch.zeros(B, 1, dtype=torch.long)], 1)
    target_out[torch.arange(B), torch.tensor(lengths) - 1] = EOS
    target_mask = torch.cat([torch.ones(B, 1, dtype=torch.bool), mask], 1)
    return Batch([src, mt], [src_mask, mt_mask], target_in, target_out, target_mask, list(range(B)))


def test_ratio_one_is_plain_teacher_forcing():
    model, batch = postech(teacher_forcing_ratio=1.0), batch_of()
    logits = model(batch)
    expected = F.cross_entropy(logits.flatten(0, 1), batch.target_out.flatten(), ignore_index=PAD,
                               reduction="sum", label_smoothing=0.1)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    assert torch.equal(model.loss(batch, 0.1), expected)
    assert torch.equal(torch.get_rng_state(), state)  # no random draw at all


@pytest.mark.parametrize("ratio", [0.9, 0.8])
@pytest.mark.parametrize("tf_pass", ["parallel", "incremental"])
def test_ratio_below_one_replaces_about_one_minus_ratio_of_the_inputs(ratio, tf_pass):
    model, batch = postech(teacher_forcing_ratio=ratio, teacher_forcing_pass=tf_pass), batch_of(B=96, T=16)
    memory = model.encode(batch.sources, batch.source_masks)
    torch.manual_seed(7)
    mixed, from_model = model.mixed_inputs(batch.target_in, memory)
    real = batch.target_in != PAD
    real[:, 0] = False  # the prefix is never replaced
    assert not (from_model & ~real).any() and torch.equal(mixed[~real], batch.target_in[~real])
    assert abs(from_model[real].float().mean().item() - (1 - ratio)) < 0.03
    changed = (mixed != batch.target_in)[real].float().mean().item()  # an untrained model rarely guesses gold
    assert 0.8 * (1 - ratio) < changed < 1.2 * (1 - ratio)
    assert (mixed[from_model] != PAD).all()
    # The loss reads the mixed inputs and scores them against the gold targets.
    torch.manual_seed(7)
    loss = model.loss(batch)
    logits = model.decode(mixed, memory).logits
    expected = F.cross_entropy(logits.flatten(0, 1), batch.target_out.flatten(), ignore_index=PAD, reduction="sum")
    torch.testing.assert_close(loss, expected)


def test_ratio_zero_feeds_the_greedy_predictions():
    batch = batch_of()
    for tf_pass in ("parallel", "incremental"):
        model = postech(teacher_forcing_ratio=0.0, teacher_forcing_pass=tf_pass)
        memory = model.encode(batch.sources, batch.source_masks)
        mixed, _ = model.mixed_inputs(batch.target_in, memory)
        if tf_pass == "parallel":  # input t = argmax at position t-1 of the teacher-forced pass
            logits = model.decode(batch.target_in, memory).logits
            logits[..., PAD] = float("-inf")
            expected = logits.argmax(-1)[:, :-1]
            real = (batch.target_in != PAD)[:, 1:]
            assert torch.equal(mixed[:, 1:][real], expected[real])
        else:  # input t = the greedy hypothesis' token t-1 (up to its </s>; greedy_search stops there)
            hyps = greedy_search(model, batch.sources, batch.source_masks, BOS, EOS,
                                 GenerationConfig(beam_size=1, max_len_a=0, max_len_b=50), forbidden=[PAD])
            for b, h in enumerate(hyps):
                greedy = h + [EOS]
                for t in range(min(len(greedy), batch.target_in.size(1) - 1)):
                    if batch.target_in[b, t + 1] != PAD:
                        assert mixed[b, t + 1].item() == greedy[t], (b, t)


# ---- §3.3 ensembles -------------------------------------------------------------------------------

def test_ensemble_of_one_is_the_model():
    model, (sources, masks) = postech(), src_mt()
    ensemble = Ensemble([model])
    for beam in (1, 4):
        cfg = GenerationConfig(beam_size=beam, max_len_b=6)
        assert ensemble.generate(sources, masks, BOS, EOS, cfg) == model.generate(sources, masks, BOS, EOS, cfg)
    target = torch.randint(4, V, (3, 5))
    torch.testing.assert_close(ensemble.decode(target, ensemble.encode(sources, masks)).logits,
                               model.decode(target, model.encode(sources, masks)).logits.log_softmax(-1))


def test_ensemble_of_two_averages_log_probs_on_a_step():
    """Two models of different architectures; a step's scores are the mean of the members' log-probs."""
    a, b = postech(seed=0, multi_source="parallel"), postech(seed=1, multi_source="sequential", mt_future_mask=True)
    (sources, masks), tokens = src_mt(), torch.full((3, 1), BOS)
    ensemble = Ensemble([a, b])
    logp_a, _ = step_log_probs(a, tokens, a.encode(sources, masks), None, 0)
    logp_b, _ = step_log_probs(b, tokens, b.encode(sources, masks), None, 0)
    out = ensemble.decode(tokens, ensemble.encode(sources, masks))
    torch.testing.assert_close(out.logits[:, -1], (logp_a + logp_b) / 2)
    logp, _ = step_log_probs(ensemble, tokens, ensemble.encode(sources, masks), None, 0)
    torch.testing.assert_close(logp, ((logp_a + logp_b) / 2).log_softmax(-1))  # renormalized by the search
    assert not torch.allclose(logp, logp_a, atol=1e-3) and not torch.allclose(logp, logp_b, atol=1e-3)
    prob = Ensemble([a, b], mode="prob").decode(tokens, ensemble.encode(sources, masks)).logits[:, -1]
    torch.testing.assert_close(prob.exp(), (logp_a.exp() + logp_b.exp()) / 2)
    cfg = GenerationConfig(beam_size=3, max_len_b=6)
    assert len(ensemble.generate(sources, masks, BOS, EOS, cfg)) == 3
    twice = Ensemble([a, a])  # identical members decode as the model
    for beam in (1, 3):
        cfg = GenerationConfig(beam_size=beam, max_len_b=6)
        assert twice.generate(sources, masks, BOS, EOS, cfg) == a.generate(sources, masks, BOS, EOS, cfg)
    with pytest.raises(MsgcoreError):
        Ensemble([])
    with pytest.raises(MsgcoreError):
        Ensemble([a], mode="max")


# ---- registration, errors, and a tiny model that learns --------------------------------------------

def test_registered_and_rebuilt_from_its_config_and_weights():
    model, (sources, masks) = postech(multi_source="parallel", mt_future_mask=True, teacher_forcing_ratio=0.9), src_mt()
    assert MODELS["PostechAPE"] is PostechAPE
    model_class = MODELS["PostechAPE"]  # what load_model does with a checkpoint's class name, config and weights
    rebuilt = model_class(model_class.config_class(**model.cfg.to_dict()))
    rebuilt.load_state_dict(model.state_dict())
    rebuilt.eval()
    assert rebuilt.cfg == model.cfg
    cfg = GenerationConfig(beam_size=2, max_len_b=5)
    assert rebuilt.generate(sources, masks, BOS, EOS, cfg) == model.generate(sources, masks, BOS, EOS, cfg)


def test_errors_are_one_line():
    model, (sources, masks) = postech(), src_mt()
    with pytest.raises(MsgcoreError, match="exactly 2 sources"):
        model.encode(sources[:1], masks[:1])
    for field, value in (("multi_source", "linear"), ("teacher_forcing_ratio", 1.5), ("teacher_forcing_pass", "x")):
        with pytest.raises(MsgcoreError, match=field):
            PostechConfig(**{field: value})


@pytest.mark.parametrize("multi_source", ["parallel", "sequential"])
def test_tiny_model_overfits_a_two_source_set(multi_source, tmp_path):
    corpus = synthetic_corpus(24, num_sources=2, seed=0)
    tokenizer = Tokenizer.train(corpus.texts(), vocab_size=60, cache_dir=tmp_path)
    encoded = encode_corpus(corpus, tokenizer)
    batch = collate(encoded, range(len(encoded)))
    torch.manual_seed(0)
    model = PostechAPE(PostechConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, d_ff=64,
                                     encoder_layers=2, decoder_layers=2, dropout=0.0, multi_source=multi_source,
                                     teacher_forcing_ratio=0.9))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(100):
        model.train()
        loss = model.loss(batch) / batch.num_target_tokens
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hyps = model.generate(batch.sources, batch.source_masks, encoded.target_prefix, tokenizer.eos_id,
                          GenerationConfig(beam_size=1), forbidden=[tokenizer.pad_id, tokenizer.bos_id])
    correct = sum(h == t for h, t in zip(hyps, encoded.target))
    assert correct == 24, (correct, hyps[:3], encoded.target[:3])


# ---- recipes: the APE triplets as a two-source corpus ------------------------------------------------

def test_synthetic_ape_triplets_and_their_encoding(tmp_path):
    from msgcore.experiments.postech_ape import do_nothing, prepare_ape, synthetic_ape
    from msgcore.metrics import corpus_score

    train, val = synthetic_ape(200, "train"), synthetic_ape(50, "val")
    assert train.source_langs == ("xa", "xt") and train.target_lang == "xt"
    assert synthetic_ape(200, "train").sources == train.sources  # seeded
    assert do_nothing(val) == val.sources[1]
    ter = corpus_score("ter", do_nothing(train), train.target).score
    assert 10 < ter < 40  # mt has errors to correct, but is close to pe
    assert synthetic_ape(200, "train", error_rate=0.0).sources[1] == train.target
    data = prepare_ape({"train": train, "val": val}, vocab_size=60, eval_examples=20, synthetic=True)
    assert len(data.encoded["train"].sources) == 2 and len(data.encoded["val"].target) == 20
    batch = collate(data.encoded["val"], range(4))
    model = postech(vocab_size=data.tokenizer.vocab_size)
    assert model.loss(batch).isfinite()
