"""Greedy and beam search: beam 1 == greedy, length rules, n-gram blocking, beam == brute force."""
import itertools

import torch

from msgcore.generation import GenerationConfig, apply_constraints, banned_ngram_tokens, beam_search, greedy_search
from msgcore.model import Transformer, preset

BOS, EOS = 2, 3


def tiny_model(vocab=12):
    torch.manual_seed(1)
    return Transformer(preset("tiny", vocab_size=vocab, d_model=32, d_ff=64, dropout=0.0)).eval()


def sources(B=4, S=6, vocab=12):
    src = torch.randint(4, vocab, (B, S))
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 3:] = False
    return [src], [mask]


def test_beam_size_one_equals_greedy():
    model, (src, mask) = tiny_model(), sources()
    cfg = GenerationConfig(beam_size=1, max_len_a=1.0, max_len_b=4)
    assert beam_search(model, src, mask, BOS, EOS, cfg) == greedy_search(model, src, mask, BOS, EOS, cfg)


def test_max_length_rule_is_per_sentence():
    model, (src, mask) = tiny_model(), sources()
    cfg = GenerationConfig(beam_size=1, max_len_a=1.0, max_len_b=0)
    out = greedy_search(model, src, mask, BOS, EOS, cfg, forbidden=[EOS])  # never stop early
    assert [len(o) for o in out] == [5, 2, 5, 5]  # a*|x|+b tokens, the last one forced to </s>


def test_min_length_forbids_early_eos():
    model, (src, mask) = tiny_model(), sources()
    cfg = GenerationConfig(beam_size=3, min_len=4, max_len_a=0, max_len_b=8)
    assert all(len(o) >= 3 for o in beam_search(model, src, mask, BOS, EOS, cfg))


def test_no_repeat_ngram_blocks_repeats():
    model, (src, mask) = tiny_model(vocab=6), sources(vocab=6)
    cfg = GenerationConfig(beam_size=2, max_len_a=0, max_len_b=12, no_repeat_ngram=2)
    for hyp in beam_search(model, src, mask, BOS, EOS, cfg, forbidden=[0, 1, 2]):
        bigrams = list(zip(hyp, hyp[1:]))
        assert len(bigrams) == len(set(bigrams))


def test_banned_ngram_tokens_on_a_hand_made_history():
    history = torch.tensor([[5, 6, 7, 5, 6]])  # "5 6" seen before, followed by 7
    matches, banned = banned_ngram_tokens(history, 3)
    assert banned[matches].tolist() == [7]


def sequence_logprob(model, src, mask, hyp):
    tokens = torch.tensor([[BOS] + hyp])
    memory = model.encode(src, mask)
    logp = torch.log_softmax(model.decode(tokens, memory).logits[0].float(), -1)
    target = hyp + [EOS]
    return sum(logp[t, y].item() for t, y in enumerate(target))


def test_beam_search_finds_the_exhaustive_best_on_a_tiny_space():
    model = tiny_model(vocab=6)
    src, mask = [torch.tensor([[4, 5, 4]])], [torch.ones(1, 3, dtype=torch.bool)]
    cfg = GenerationConfig(beam_size=16, max_len_a=0, max_len_b=3, len_penalty=0.0)
    best = beam_search(model, src, mask, BOS, EOS, cfg, forbidden=[0, 1, 2])[0]
    candidates = [list(c) for n in range(0, 3) for c in itertools.product([4, 5], repeat=n)]
    scores = {tuple(c): sequence_logprob(model, src, mask, c) for c in candidates}
    assert tuple(best) == max(scores, key=scores.get)


def test_sequence_log_probs_equal_the_greedy_steps_and_ignore_padding():
    from msgcore.generation import sequence_log_probs, step_log_probs

    model, ((src,), (mask,)) = tiny_model(), sources()
    hyps = greedy_search(model, [src], [mask], BOS, EOS, GenerationConfig(beam_size=1, max_len_b=4))
    logp, lengths = sequence_log_probs(model, [src], [mask], BOS, EOS, hyps)
    assert lengths.tolist() == [len(h) + 1 for h in hyps]
    for i, hyp in enumerate(hyps):  # recompute row i alone, step by step over the KV cache
        memory = model.encode([src[i:i + 1]], [mask[i:i + 1]])
        tokens, cache, total = torch.tensor([[BOS]]), None, 0.0
        for step, token in enumerate([*hyp, EOS]):
            step_logp, cache = step_log_probs(model, tokens, memory, cache, step)
            total += step_logp[0, token].item()
            tokens = torch.cat([tokens, torch.tensor([[token]])], 1)
        assert abs(logp[i].item() - total) < 1e-4


def test_rescore_picks_the_best_candidate_per_token():
    from msgcore.generation import rescore, sequence_log_probs

    model, ((src,), (mask,)) = tiny_model(), sources()
    candidates = [[[5, 6], [7], [8, 9, 10]] for _ in range(src.size(0))]
    chosen = rescore(model, [src], [mask], BOS, EOS, candidates)
    for i in range(src.size(0)):
        scores = []
        for hyp in candidates[i]:
            logp, n = sequence_log_probs(model, [src[i:i + 1]], [mask[i:i + 1]], BOS, EOS, [hyp])
            scores.append((logp / n).item())
        assert chosen[i] == candidates[i][max(range(3), key=scores.__getitem__)]


def beam_search_models():
    """One model per decoder kind, each with sources of its own shape (vocabulary 40)."""
    from msgcore.models.marge import MargeConfig, MargeTransformer
    from msgcore.models.mixrep import MixRepConfig, MixRepTransformer
    from msgcore.models.postech_ape import PostechAPE, PostechConfig
    from msgcore.models.trice import TriceConfig, TriceTransformer

    dims = dict(vocab_size=40, d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.0)
    yield "transformer", Transformer(preset("tiny", **dims)), 1
    yield "trice", TriceTransformer(TriceConfig(**dims)), 2
    for kind in ("parallel", "sequential"):
        yield f"postech {kind}", PostechAPE(PostechConfig(**{**dims, "encoder_layers": 3}, multi_source=kind)), 2
    for mixing in ("parallel", "stacked"):
        yield f"mixrep {mixing}", MixRepTransformer(MixRepConfig(**dims, bpe_vocab_size=40, mixing=mixing)), 2
    yield "marge", MargeTransformer(MargeConfig(**{**dims, "decoder_layers": 3}, relevance_layers=1,
                                                decoder_self_only_layers=1)), 2


def padded_sources(K: int, B: int, width: int, lengths: dict[int, int]):
    """K sources (B, width + k) of vocabulary 40, row r padded (id 0) after lengths[r] tokens in each."""
    srcs = [torch.randint(4, 40, (B, width + k)) for k in range(K)]
    masks = [torch.ones_like(s, dtype=torch.bool) for s in srcs]
    for s, m in zip(srcs, masks):
        for row, length in lengths.items():
            m[row, length:] = False
        s[~m] = 0
    return srcs, masks


def test_beam_hypotheses_sharing_their_sentences_memory_equal_the_memory_repeated_per_hypothesis():
    from msgcore.bench import PerHypothesisMemory
    from msgcore.generation import Ensemble

    cfg = GenerationConfig(beam_size=3, max_len_a=1.0, max_len_b=3)
    for name, model, K in beam_search_models():
        torch.manual_seed(0)
        model.eval()
        srcs, masks = padded_sources(K, 4, 5, {1: 3})
        memory, rows = model.encode(srcs, masks), torch.arange(4).repeat_interleave(3)
        tokens = torch.randint(4, 40, (12, 4))  # 3 hypotheses per sentence, 4 target positions
        torch.testing.assert_close(model.decode(tokens, memory).logits,
                                   model.decode(tokens, [m.index_select(rows) for m in memory]).logits,
                                   atol=1e-5, rtol=1e-5, msg=name)
        shared = beam_search(model, srcs, masks, BOS, EOS, cfg, forbidden=[0, 1, 2])
        assert shared == beam_search(PerHypothesisMemory(model, 3), srcs, masks, BOS, EOS, cfg, forbidden=[0, 1, 2]), name
        if name == "postech parallel":  # an ensemble's members share their memory rows the same way
            ensemble = Ensemble([model, model])
            assert beam_search(ensemble, srcs, masks, BOS, EOS, cfg, forbidden=[0, 1, 2]) == shared


def test_sentences_leave_the_beam_batch_when_done_without_changing_any_hypothesis(monkeypatch):
    """Dropping a done sentence's rows (tokens, cache, memory) gives every model kind, a memory repeated per
    hypothesis and an ensemble the hypotheses of a search that keeps decoding them."""
    from msgcore import generation
    from msgcore.bench import PerHypothesisMemory, keep_done_sentences
    from msgcore.generation import Ensemble

    dropped, drop = [], generation.sentences_to_keep

    def recording(done):
        keep = drop(done)
        if keep:
            dropped.append(len(done) - len(keep))
        return keep

    cfg = GenerationConfig(beam_size=3, max_len_a=1.0, max_len_b=2)
    for name, model, K in beam_search_models():
        torch.manual_seed(0)
        model.eval()
        srcs, masks = padded_sources(K, 5, 6, {0: 2, 2: 3, 3: 5, 4: 1})  # the sentences end at other steps
        searchers = [model, PerHypothesisMemory(model, 3)] + ([Ensemble([model, model])] if name == "trice" else [])
        for searcher in searchers:
            dropped.clear()
            monkeypatch.setattr(generation, "sentences_to_keep", recording)
            pruned = beam_search(searcher, srcs, masks, BOS, EOS, cfg, forbidden=[0, 1, 2])
            assert sum(dropped) >= 2, name  # sentences did leave the batch before the last step
            monkeypatch.setattr(generation, "sentences_to_keep", keep_done_sentences)  # the bench's ablation
            assert pruned == beam_search(searcher, srcs, masks, BOS, EOS, cfg, forbidden=[0, 1, 2]), name


def test_sentences_to_keep_names_the_searching_positions_or_none():
    from msgcore.generation import sentences_to_keep

    assert sentences_to_keep([False, False]) is None
    assert sentences_to_keep([True, False, True, False]) == [1, 3]
    assert sentences_to_keep([True, True]) == []


def test_topk_in_chunks_equals_torch_topk_with_forbidden_tokens_a_tail_and_a_row_at_its_limit():
    from msgcore.generation import topk_in_chunks

    torch.manual_seed(0)
    for width in (40_000, 40_003, 2_000):  # many chunks; 3 columns past the last chunk; too narrow to chunk
        x = torch.randn(4, width)
        x[:, 5::97] = float("-inf")  # forbidden tokens
        x[1] = float("-inf")
        x[1, width - 1] = 0.0  # a row at its length limit: one finite entry, in the tail when there is one
        values, index = topk_in_chunks(x, 10)
        expected_values, expected_index = x.topk(10, dim=1)
        assert torch.equal(values, expected_values)
        assert torch.equal(x.gather(1, index), values)  # the indices point at those values
        assert (index.sort(1).values.diff(dim=1) > 0).all()  # ten different entries per row
        rows_without_ties = [0, 2, 3]
        assert torch.equal(index[rows_without_ties], expected_index[rows_without_ties])


def test_beam_search_over_chunked_candidates_equals_one_topk_over_all(monkeypatch):
    """With a vocabulary wide enough to chunk (k*V >= 4 * 2k * 64), the two-pass top-k changes no hypothesis."""
    from msgcore import generation

    model, cfg = tiny_model(vocab=600), GenerationConfig(beam_size=4, max_len_a=1.0, max_len_b=3)
    torch.manual_seed(0)
    srcs, masks = sources(B=3, vocab=600)
    widths, chunking = [], generation.topk_in_chunks
    monkeypatch.setattr(generation, "topk_in_chunks", lambda x, n: widths.append(x.size(1)) or chunking(x, n))
    chunked = beam_search(model, srcs, masks, BOS, EOS, cfg, forbidden=[0, 1, 2])
    assert widths and all(w - w % 64 >= 4 * 8 * 64 for w in widths)  # every step took the chunked path
    monkeypatch.setattr(generation, "topk_in_chunks", lambda x, n: x.topk(n, dim=1))
    assert chunked == beam_search(model, srcs, masks, BOS, EOS, cfg, forbidden=[0, 1, 2])
    assert all(len(hypothesis) > 0 for hypothesis in chunked)


def test_constraints_mask_forbidden_ids_and_leave_only_eos_at_the_length_limit():
    logp = torch.log_softmax(torch.randn(3, 6), dim=-1)
    expected = logp.clone()
    out = apply_constraints(logp.clone(), torch.zeros(3, 2, dtype=torch.long), step=4,
                            max_len=torch.tensor([5, 9, 5]), eos_id=3, forbidden=torch.tensor([0, 1]),
                            cfg=GenerationConfig())
    assert torch.isinf(out[:, :2]).all()  # forbidden everywhere
    assert torch.equal(out[1, 2:], expected[1, 2:])  # a row below its limit keeps every other log-prob
    for row in (0, 2):  # at the limit: only </s>, with its own log-prob (scores stay comparable)
        assert out[row, 3] == expected[row, 3] and torch.isinf(out[row, [0, 1, 2, 4, 5]]).all()
