"""Greedy and beam search: beam 1 == greedy, length rules, n-gram blocking, beam == brute force."""
import itertools

import torch

from msgcore.generation import GenerationConfig, banned_ngram_tokens, beam_search, greedy_search
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
