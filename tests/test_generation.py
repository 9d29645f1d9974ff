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


# ---- the searches pinned to the reference implementation (msgcore.generation as it was before the per-step op
# count was cut): every finished hypothesis, its score and the order they finished in -----------------------------

def reference_constraints(logp, tokens, step, max_len, eos_id, forbidden, cfg):
    """apply_constraints as it was on a GPU (which masks for the length limit at every step; a CPU skipped the steps
    with no row at its limit, for the same log-probs): the reference's masking of log-probs (N, V)."""
    from msgcore.generation import banned_ngram_tokens

    eos_logp = logp[:, eos_id].clone()
    logp.index_fill_(1, forbidden, float("-inf"))
    if step + 1 < cfg.min_len:
        logp[:, eos_id] = float("-inf")
    if cfg.no_repeat_ngram > 0 and tokens.size(1) >= cfg.no_repeat_ngram:
        matches, banned = banned_ngram_tokens(tokens, cfg.no_repeat_ngram)
        rows = torch.arange(tokens.size(0)).unsqueeze(1).expand_as(banned)
        logp[rows[matches], banned[matches]] = float("-inf")
    at_limit = step + 1 >= max_len
    logp.masked_fill_(at_limit.unsqueeze(1), float("-inf"))
    logp[:, eos_id] = torch.where(at_limit, eos_logp, logp[:, eos_id])
    return logp


def reference_step(model, tokens, memory, cache, step):
    out = model.decode(tokens[:, -1:], memory, cache, start_pos=step)
    return torch.log_softmax(out.logits[:, -1].float(), dim=-1), out.cache


@torch.no_grad()
def reference_beam_search(model, sources, source_masks, cfg, forbidden=()):
    """beam_search as it was, on a CPU: each sentence's finished (score, hypothesis) pairs, in finishing order."""
    from msgcore.generation import hypothesis_rows, max_lengths, memory_rows, topk_in_chunks

    B, k = sources[0].size(0), cfg.beam_size
    memory = model.encode(sources, source_masks)
    per_hypothesis = memory_rows(memory[0]) != B
    max_len = max_lengths(source_masks, cfg).repeat_interleave(k)
    tokens = torch.full((B * k, 1), BOS, dtype=torch.long)
    scores = torch.full((B, k), float("-inf"))
    scores[:, 0] = 0.0
    finished = [[] for _ in range(B)]
    live = list(range(B))
    forbidden_ids = torch.tensor(list(forbidden), dtype=torch.long)
    cache = None
    for step in range(int(max_len.max())):
        logp, cache = reference_step(model, tokens, memory, cache, step)
        logp = reference_constraints(logp, tokens, step, max_len, EOS, forbidden_ids, cfg)
        V = logp.size(-1)
        cand_scores, index = topk_in_chunks(logp.add_(scores.view(-1, 1)).view(len(live), k * V), 2 * k)
        cand_beam, cand_token = index // V, index % V
        is_eos = (cand_token == EOS) & torch.isfinite(cand_scores)
        pairs = is_eos[:, :k].nonzero()
        if pairs.numel():
            b, rank = pairs.unbind(1)
            hypotheses = tokens[b * k + cand_beam[b, rank], 1:].tolist()
            for (position, _), hypothesis, score in zip(pairs.tolist(), hypotheses, cand_scores[b, rank].tolist()):
                if len(finished[live[position]]) < k:
                    finished[live[position]].append((score / (step + 1) ** cfg.len_penalty, hypothesis))
        done = [len(finished[b]) >= k for b in live]
        keep = [i for i, d in enumerate(done) if not d] if any(done) else None
        if keep == []:
            break
        scores, order = cand_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=1)
        beam, token = cand_beam.gather(1, order), cand_token.gather(1, order)
        blocks, memory_index = torch.arange(len(live)), None
        if keep is not None:
            blocks = torch.tensor(keep)
            scores, beam, token = scores[blocks], beam[blocks], token[blocks]
            max_len, live = max_len.view(-1, k)[blocks].view(-1), [live[i] for i in keep]
            memory_index = hypothesis_rows(blocks, k) if per_hypothesis else blocks
            memory = [m.index_select(memory_index) for m in memory]
        rows = (blocks.unsqueeze(1) * k + beam).view(-1)
        tokens = torch.cat([tokens[rows], token.view(-1, 1)], dim=1)
        cache = [layer.index_select(rows, memory_index) for layer in cache]
    return finished


@torch.no_grad()
def reference_greedy_search(model, sources, source_masks, cfg, forbidden=()):
    """greedy_search as it was, on a CPU."""
    from msgcore.generation import max_lengths, strip

    memory = model.encode(sources, source_masks)
    max_len = max_lengths(source_masks, cfg)
    tokens = torch.full((sources[0].size(0), 1), BOS, dtype=torch.long)
    finished = torch.zeros(sources[0].size(0), dtype=torch.bool)
    forbidden_ids = torch.tensor(list(forbidden), dtype=torch.long)
    cache = None
    for step in range(int(max_len.max())):
        logp, cache = reference_step(model, tokens, memory, cache, step)
        logp = reference_constraints(logp, tokens, step, max_len, EOS, forbidden_ids, cfg)
        next_token = logp.argmax(-1).masked_fill(finished, EOS)
        tokens = torch.cat([tokens, next_token.unsqueeze(1)], dim=1)
        finished |= next_token == EOS
        if finished.all():
            break
    return [strip(row, EOS) for row in tokens[:, 1:].tolist()]


PINNED_SETTINGS = [  # (vocabulary, GenerationConfig fields, forbidden ids)
    (12, dict(beam_size=1, max_len_a=1.0, max_len_b=4), [0, 1, 2]),
    (12, dict(beam_size=4, max_len_a=1.0, max_len_b=4), [0, 1, 2]),
    (12, dict(beam_size=5, max_len_a=1.0, max_len_b=5), []),
    (12, dict(beam_size=5, max_len_a=1.0, max_len_b=6, min_len=3, len_penalty=0.6), [0, 1, 2]),
    (8, dict(beam_size=4, max_len_a=0.0, max_len_b=12, no_repeat_ngram=2, len_penalty=1.3), [0, 1, 2]),
    (12, dict(beam_size=5, max_len_a=1.5, max_len_b=3, no_repeat_ngram=3, min_len=2, len_penalty=0.0), [0, 1]),
    (12, dict(beam_size=4, max_len_a=1.0, max_len_b=2), [0, 1, 2, EOS]),  # </s> only at the length limit
    (600, dict(beam_size=4, max_len_a=1.0, max_len_b=3, min_len=2), [0, 1, 2]),  # wide enough for topk_in_chunks
]


def pinned_case(vocab: int, fields: dict, seed: int):
    """A seeded tiny model and 6 sources of lengths 1..6 (so that sentences reach their limits at other steps)."""
    model = tiny_model(vocab=vocab)
    torch.manual_seed(seed)
    src = torch.randint(4, vocab, (6, 6))
    mask = torch.arange(6).unsqueeze(0) < torch.tensor([6, 1, 4, 2, 6, 3]).unsqueeze(1)
    return model, [src.masked_fill(~mask, 0)], [mask], GenerationConfig(**fields)


def assert_same_hypotheses(got, expected, where):
    """The same hypotheses in the same order, with scores equal to 1e-5."""
    assert [[h for _, h in f] for f in got] == [[h for _, h in f] for f in expected], where
    for f, g in zip(got, expected):
        for (score, _), (reference, _) in zip(f, g):
            assert abs(score - reference) <= 1e-5 * max(1.0, abs(reference)), where


def test_beam_search_equals_the_reference_implementation_hypotheses_and_scores():
    from msgcore.generation import beam_search_hypotheses

    for vocab, fields, forbidden in PINNED_SETTINGS:
        for seed in range(3):
            model, srcs, masks, cfg = pinned_case(vocab, fields, seed)
            expected = reference_beam_search(model, srcs, masks, cfg, forbidden)
            got = beam_search_hypotheses(model, srcs, masks, BOS, EOS, cfg, forbidden)
            assert_same_hypotheses(got, expected, (vocab, fields, forbidden, seed))
            assert beam_search(model, srcs, masks, BOS, EOS, cfg, forbidden) == [max(f)[1] if f else []
                                                                               for f in expected]
            assert all(len(f) == cfg.beam_size for f in expected)  # every sentence did finish k hypotheses


def test_beam_search_of_other_searchers_equals_the_reference_implementation():
    """A memory repeated per hypothesis, an ensemble, done sentences kept in the batch (the bench's ablations)."""
    from msgcore import generation
    from msgcore.bench import PerHypothesisMemory, keep_done_sentences
    from msgcore.generation import Ensemble, beam_search_hypotheses

    model, srcs, masks, cfg = pinned_case(12, dict(beam_size=3, max_len_a=1.0, max_len_b=3, no_repeat_ngram=2), 0)
    torch.manual_seed(2)
    other = Transformer(preset("tiny", vocab_size=12, d_model=32, d_ff=64, dropout=0.0)).eval()
    for searcher in (PerHypothesisMemory(model, 3), Ensemble([model, other], mode="prob")):
        expected = reference_beam_search(searcher, srcs, masks, cfg, [0, 1, 2])
        assert_same_hypotheses(beam_search_hypotheses(searcher, srcs, masks, BOS, EOS, cfg, [0, 1, 2]), expected,
                               type(searcher).__name__)
    drop = generation.sentences_to_keep
    try:
        generation.sentences_to_keep = keep_done_sentences
        got = beam_search_hypotheses(model, srcs, masks, BOS, EOS, cfg, [0, 1, 2])
    finally:
        generation.sentences_to_keep = drop
    assert_same_hypotheses(got, reference_beam_search(model, srcs, masks, cfg, [0, 1, 2]), "done sentences kept")


def test_greedy_search_equals_the_reference_implementation():
    for vocab, fields, forbidden in PINNED_SETTINGS:
        for seed in range(3):
            model, srcs, masks, cfg = pinned_case(vocab, {**fields, "beam_size": 1}, seed)
            expected = reference_greedy_search(model, srcs, masks, cfg, forbidden)
            assert greedy_search(model, srcs, masks, BOS, EOS, cfg, forbidden) == expected, (vocab, fields, seed)
