"""Greedy and beam search, batched, with incremental decoding over the explicit KV cache.

Beam search follows the usual NMT recipe (Wu et al. 2016; fairseq's `SequenceGenerator`):
    * each step expands every live hypothesis and keeps the 2k best candidates per sentence;
    * a candidate ending in </s> that ranks within the top k is finished, scored
      log p(y) / |y|^alpha (|y| counts </s>; alpha = `len_penalty`);
    * the other top-k candidates live on; a sentence is done once it has k finished hypotheses, and leaves the
      batch.
Both searches work for any model with `encode(sources, masks)` and `decode(tokens, memory, cache,
start_pos)`, so single- and multi-source models share them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from msgcore.layers import EncoderOut
from msgcore.utils import MsgcoreError


@dataclass
class GenerationConfig:
    beam_size: int = 5  # 1 = greedy search
    max_len_a: float = 1.2  # the hypothesis may be up to a * (longest source length) + b tokens long
    max_len_b: int = 10
    min_len: int = 1  # </s> is forbidden before this many tokens
    len_penalty: float = 1.0  # alpha in score / |y|^alpha
    no_repeat_ngram: int = 0  # forbid repeating any n-gram of this size (0 = off)

    def __post_init__(self) -> None:
        """Refuse settings that would decode garbage or crash, with one line naming the field."""
        checks = {"beam_size": self.beam_size >= 1, "max_len_a": math.isfinite(self.max_len_a) and self.max_len_a >= 0,
                  "max_len_b": self.max_len_b >= 0, "min_len": self.min_len >= 0,
                  "len_penalty": math.isfinite(self.len_penalty), "no_repeat_ngram": self.no_repeat_ngram >= 0}
        for name, ok in checks.items():
            if not ok:
                raise MsgcoreError(f"GenerationConfig.{name} = {getattr(self, name)!r} is out of range")


def max_lengths(source_masks: list[Tensor], cfg: GenerationConfig) -> Tensor:
    """(B,) longest allowed output, counting </s>: a * max_k |x_k| + b."""
    source_len = torch.stack([m.sum(1) for m in source_masks]).amax(0)  # (B,)
    return (cfg.max_len_a * source_len.float() + cfg.max_len_b).long().clamp(min=cfg.min_len + 1)


def banned_ngram_tokens(tokens: Tensor, n: int) -> Tensor:
    """(N, L) histories -> bool (N, L-n+1) matches and the (N, L-n+1) tokens they would repeat.

    Token w is banned for row i if (last n-1 tokens of row i) + w already occurs in row i.
    """
    ngrams = tokens.unfold(1, n, 1)  # (N, L-n+1, n)
    last = tokens[:, tokens.size(1) - (n - 1):]  # (N, n-1)
    matches = (ngrams[:, :, :-1] == last.unsqueeze(1)).all(-1)  # (N, L-n+1)
    return matches, ngrams[:, :, -1]


def apply_constraints(logp: Tensor, tokens: Tensor, step: int, max_len: Tensor, eos_id: int,
                      forbidden: Tensor, cfg: GenerationConfig, at_limit: bool | None = None) -> Tensor:
    """Mask log-probs (N, V) in place for min/max length, special tokens (`forbidden`, ids on logp's device) and
    n-gram repeats.

    `at_limit` says whether some row reaches its limit `max_len` (N,) at this step, when the caller knows it without
    asking the device (the searches keep the limits on the host too); None asks on a CPU, and masks elsewhere, where
    asking would wait for the device. Most steps have no row at its limit, and then skip that masking.
    """
    if at_limit is None:
        at_limit = logp.device.type != "cpu" or bool((max_len <= step + 1).any())
    eos_logp = logp[:, eos_id].clone() if at_limit else None  # (N,) a row at its limit keeps the real log p(</s>)
    if forbidden.numel():
        logp.index_fill_(1, forbidden, float("-inf"))
    if step + 1 < cfg.min_len:
        logp.select(1, eos_id).fill_(float("-inf"))
    if cfg.no_repeat_ngram > 0 and tokens.size(1) >= cfg.no_repeat_ngram:
        block_repeated_ngrams(logp, tokens, cfg.no_repeat_ngram)
    if at_limit:
        limit = max_len <= step + 1  # (N,) the next token must be </s>
        logp.masked_fill_(limit.unsqueeze(1), float("-inf"))
        eos_column = logp.select(1, eos_id)  # (N,) a view: the copy writes into logp
        eos_column.copy_(torch.where(limit, eos_logp, eos_column))  # keep its real log-prob: scores comparable
    return logp


def block_repeated_ngrams(logp: Tensor, tokens: Tensor, n: int) -> None:
    """Set log p(w) = -inf in logp (N, V) wherever the histories `tokens` (N, L) + w would repeat an n-gram.

    Without waiting for the device: the banned tokens go into a (N, V + 1) mask by one scatter, and the positions
    that ban nothing write into the spare last column (picking the banned ones out by `matches` would be a
    nonzero, which waits for the device).
    """
    matches, banned = banned_ngram_tokens(tokens, n)  # (N, L-n+1) each
    V = logp.size(1)
    columns = torch.where(matches, banned, V)  # (N, L-n+1): the banned token, or the spare column
    mask = torch.zeros(logp.size(0), V + 1, dtype=torch.bool, device=logp.device).scatter_(1, columns, True)
    logp.masked_fill_(mask[:, :V], float("-inf"))


def step_log_probs(model, tokens: Tensor, memory: list[EncoderOut], cache, step: int) -> tuple[Tensor, list]:
    """Feed the last token of each row; return next-token log-probs (N, V) in fp32 and the new cache."""
    out = model.decode(tokens[:, -1:], memory, cache, start_pos=step)
    logits = out.logits[:, -1]  # (N, V)
    if logits.dtype != torch.float32:  # e.g. bf16 under autocast (`.float()` of fp32 would still be an op)
        logits = logits.float()
    if logits.requires_grad:
        return torch.log_softmax(logits, dim=-1), out.cache
    return torch.log_softmax(logits, dim=-1, out=logits), out.cache  # in place: no new (N, V) tensor per step


@torch.no_grad()
def greedy_search(model, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
                  cfg: GenerationConfig, forbidden: list[int] = ()) -> list[list[int]]:
    """Pick the most probable token at each step. Returns token ids without prefix and </s>.

    Per step the host waits for the device once (whether every row has ended); the length limits are read to the
    host once, so no step asks the device whether a row is at its limit.
    """
    memory = model.encode(sources, source_masks)
    B, device = sources[0].size(0), sources[0].device
    max_len = max_lengths(source_masks, cfg)  # (B,)
    limits = max_len.tolist()  # the host's copy: the steps and the lowest limit (from which a row may be at it)
    tokens = torch.full((B, 1), prefix_id, dtype=torch.long, device=device)  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    forbidden_ids = torch.tensor(list(forbidden), dtype=torch.long, device=device)
    cache, shortest = None, min(limits)
    for step in range(max(limits)):
        logp, cache = step_log_probs(model, tokens, memory, cache, step)
        logp = apply_constraints(logp, tokens, step, max_len, eos_id, forbidden_ids, cfg,
                                 at_limit=step + 1 >= shortest)
        next_token = logp.argmax(-1).masked_fill_(finished, eos_id)  # (B,) an ended row goes on with </s>
        tokens = torch.cat([tokens, next_token.unsqueeze(1)], dim=1)
        finished = next_token == eos_id  # ended rows emit </s>: this is `finished | new </s>` in one op
        if finished.all().item():  # `.item()`: `if tensor` would dispatch one op more (is_nonzero)
            break
    return [strip(row, eos_id) for row in tokens[:, 1:].tolist()]


def strip(ids: list[int], eos_id: int) -> list[int]:
    """Cut a hypothesis at its first </s>."""
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


@torch.no_grad()
def beam_search(model, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
                cfg: GenerationConfig, forbidden: list[int] = ()) -> list[list[int]]:
    """Batched beam search; returns the best finished hypothesis per sentence (`beam_search_hypotheses`)."""
    finished = beam_search_hypotheses(model, sources, source_masks, prefix_id, eos_id, cfg, forbidden)
    return [max(f)[1] if f else [] for f in finished]


@torch.no_grad()
def beam_search_hypotheses(model, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
                           cfg: GenerationConfig, forbidden: list[int] = ()) -> list[list[tuple[float, list[int]]]]:
    """Batched beam search: each sentence's finished hypotheses, (score, token ids without prefix and </s>) in the
    order they finished, at most k.

    A sentence with k finished hypotheses leaves the batch (as in fairseq's SequenceGenerator): its rows of the
    tokens, the cache and the memory are dropped at the reorder that every step does anyway, so the remaining steps
    compute only the sentences still searching.

    On a GPU the host's time goes into dispatching operators, so a step dispatches few: the per-search constants
    are made once, the length limits are read to the host once (no step asks the device whether a row is at its
    limit), and the host waits for the device once per step (which top-k candidates end in </s>), plus once more
    for their hypotheses when some do.
    """
    B, k, device = sources[0].size(0), cfg.beam_size, sources[0].device
    memory = model.encode(sources, source_masks)  # B rows: cross-attention lets a sentence's k hypotheses share one
    per_hypothesis = memory_rows(memory[0]) != B  # a memory repeated per hypothesis (the bench's ablation)
    max_len = max_lengths(source_masks, cfg)  # (B,)
    limits = max_len.tolist()  # the host's copy, per sentence of the input
    max_len = max_len.repeat_interleave(k)  # (B*k,) per hypothesis row
    tokens = torch.full((B * k, 1), prefix_id, dtype=torch.long, device=device)
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one alive so candidates are distinct
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    live = list(range(B))  # the sentence each row block of the batch belongs to
    shortest = min(limits)  # the lowest limit of a live sentence
    first_rows = torch.arange(B, device=device).unsqueeze(1) * k  # (B', 1) the first row of each live sentence
    neg_inf = torch.tensor(float("-inf"), device=device)  # a tensor: comparing to a Python float costs a cast op
    forbidden_ids = torch.tensor(list(forbidden), dtype=torch.long, device=device)
    cache = None
    for step in range(max(limits)):
        logp, cache = step_log_probs(model, tokens, memory, cache, step)
        logp = apply_constraints(logp, tokens, step, max_len, eos_id, forbidden_ids, cfg, at_limit=step + 1 >= shortest)
        cand_scores, cand_beam, cand_token = best_candidates(scores, logp, 2 * k)  # (B', 2k) each
        # scores are sums of log-probs, in [-inf, 0] or NaN: `> -inf` is isfinite in one op
        is_eos = (cand_token == eos_id) & (cand_scores > neg_inf)  # (B', 2k)
        keep = None  # the batch positions of the sentences still searching; None: no sentence leaves
        if finish_hypotheses([finished[b] for b in live], tokens, cand_scores, cand_beam, is_eos, step, k,
                             cfg.len_penalty):
            keep = sentences_to_keep([len(finished[b]) >= k for b in live])
            if keep == []:
                break
        scores, beam, token = next_beams(cand_scores, cand_beam, cand_token, is_eos, k)  # (B', k) each
        rows = first_rows + beam  # (B', k) the rows of the hypotheses that the new beams extend
        memory_index = None
        if keep is not None:  # drop the done sentences' rows
            blocks = torch.tensor(keep, device=device)  # (B'',) their batch positions
            scores, rows, token = scores[blocks], rows[blocks], token[blocks]
            max_len, live = max_len.view(-1, k)[blocks].view(-1), [live[i] for i in keep]
            first_rows, shortest = first_rows[:len(live)], min(limits[b] for b in live)
            memory_index = hypothesis_rows(blocks, k) if per_hypothesis else blocks
            memory = [m.index_select(memory_index) for m in memory]
        rows = rows.view(-1)  # (B'*k,)
        tokens = torch.cat([tokens[rows], token.view(-1, 1)], dim=1)
        cache = [layer.index_select(rows, memory_index) for layer in cache]  # cross K/V have the memory's rows
    return finished


def sentences_to_keep(done: list[bool]) -> list[int] | None:
    """The batch positions of the sentences still searching, or None when none is done (nothing to drop)."""
    return [i for i, d in enumerate(done) if not d] if any(done) else None


def hypothesis_rows(sentences: Tensor, k: int) -> Tensor:
    """(n,) sentence positions -> (n*k,) the rows of their k hypotheses."""
    return (sentences.unsqueeze(1) * k + torch.arange(k, device=sentences.device)).view(-1)


def memory_rows(memory) -> int:
    """Batch rows of one memory entry: an EncoderOut (or a model's subclass of it), or an ensemble member's."""
    return memory.mask.size(0) if hasattr(memory, "mask") else memory_rows(memory.parts[0])


def best_candidates(scores: Tensor, logp: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The n best one-token extensions of each sentence's k beams: (scores, source beam, token), each (B, n).

    scores (B, k) of the live beams, logp (B*k, V), which is overwritten: every candidate scores
    score(beam) + log p(token | beam).
    """
    B, k = scores.shape
    V = logp.size(-1)
    candidates = logp.add_(scores.view(-1, 1)).view(B, k * V)  # (B, k*V), in place: no new (B*k, V) tensor
    cand_scores, index = topk_in_chunks(candidates, n)  # (B, n)
    return cand_scores, torch.div(index, V, rounding_mode="floor"), index % V  # div: one op, `//` two


def topk_in_chunks(x: Tensor, n: int, chunk: int = 64) -> tuple[Tensor, Tensor]:
    """`x.topk(n, dim=1)` of a wide (B, W) tensor in two cheap passes: the n chunks of `chunk` columns with the
    highest maxima, then the n best entries among those chunks' columns (and the < `chunk` columns left over).

    Exact: each of the n best entries lies in a chunk whose maximum is at least that entry, and only n - 1 other
    entries are higher, so its chunk ranks within the n best chunks. On 2 CPU threads it took 0.55 ms against
    torch.topk's 1.6 ms for the 10 best of (64, 40,000) scores (beam 5, an 8k vocabulary; the bench's ablation row
    "one torch.topk over all k*V candidates"). Only measured on CPU, so other devices keep torch.topk. Ties may come
    out in another order than torch.topk's (which does not specify one either).
    """
    B, W = x.shape
    body = W - W % chunk
    if x.device.type != "cpu" or body < 4 * n * chunk:  # narrow rows: the second pass would read most of them again
        return x.topk(n, dim=1)
    chunk_max = x[:, :body].unflatten(1, (-1, chunk)).amax(2)  # (B, W // chunk)
    best_chunks = chunk_max.topk(n, dim=1).indices  # (B, n)
    columns = (best_chunks.unsqueeze(2) * chunk + torch.arange(chunk, device=x.device)).flatten(1)  # (B, n*chunk)
    if body < W:
        columns = torch.cat([columns, torch.arange(body, W, device=x.device).expand(B, -1)], dim=1)
    values, position = x.gather(1, columns).topk(n, dim=1)  # (B, n)
    return values, columns.gather(1, position)


def finish_hypotheses(finished, tokens: Tensor, cand_scores: Tensor, cand_beam: Tensor, is_eos: Tensor,
                      step: int, k: int, len_penalty: float) -> bool:
    """Move </s> candidates ranked within the top k into each sentence's finished list (one per batch position), and
    say whether there were any.

    Finding them is the step's one wait for the device. When there are some, the candidates' scores and source beams
    (B, 2k) come to the host whole, one small copy each, and the hypotheses they end in one more copy."""
    pairs = is_eos[:, :k].nonzero().tolist()  # [(batch position, rank)] of the </s> candidates within the top k
    if not pairs:
        return False
    scores, beams = cand_scores.tolist(), cand_beam.tolist()
    rows = [b * k + beams[b][rank] for b, rank in pairs]  # the hypotheses (rows of `tokens`) they extend
    hypotheses = tokens[torch.tensor(rows, device=tokens.device)].tolist()  # with the prefix
    for (b, rank), hypothesis in zip(pairs, hypotheses):
        if len(finished[b]) >= k:
            continue  # this sentence is done; its remaining beams are ignored
        finished[b].append((scores[b][rank] / (step + 1) ** len_penalty, hypothesis[1:]))
    return True


def next_beams(cand_scores: Tensor, cand_beam: Tensor, cand_token: Tensor, is_eos: Tensor,
               k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The k best candidates that do not end in </s>: (scores, source beam, token), each (B, k).

    cand_scores (B, 2k) is overwritten (the candidates ending in </s> get -inf)."""
    scores, order = cand_scores.masked_fill_(is_eos, float("-inf")).topk(k, dim=1)  # (B, k)
    return scores, cand_beam.gather(1, order), cand_token.gather(1, order)


def generate(model, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
             cfg: GenerationConfig | None = None, forbidden: list[int] = ()) -> list[list[int]]:
    """Greedy search when beam_size == 1, else beam search. Puts the model in eval mode."""
    cfg = cfg or GenerationConfig()
    model.eval()
    search = greedy_search if cfg.beam_size == 1 else beam_search
    return search(model, sources, source_masks, prefix_id, eos_id, cfg, forbidden)


# ---- scoring given hypotheses (e.g. an autoregressive teacher rescoring NAT candidates) --------------

@torch.no_grad()
def sequence_log_probs(model, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
                       hypotheses: list[list[int]], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Teacher-forced log p(y </s> | x) of one hypothesis per row (B,), and the lengths |y| + 1 (B,)."""
    model.eval()
    lengths = torch.tensor([len(h) + 1 for h in hypotheses], device=sources[0].device)  # counting </s>
    T = int(lengths.max())
    target_in = torch.full((len(hypotheses), T), pad_id, dtype=torch.long, device=sources[0].device)
    target_out = target_in.clone()
    for i, ids in enumerate(hypotheses):
        target_in[i, :len(ids) + 1] = torch.tensor([prefix_id, *ids])
        target_out[i, :len(ids) + 1] = torch.tensor([*ids, eos_id])
    logits = model.decode(target_in, model.encode(sources, source_masks)).logits  # (B, T, V)
    token_logp = torch.log_softmax(logits.float(), -1).gather(-1, target_out.unsqueeze(-1)).squeeze(-1)  # (B, T)
    real = torch.arange(T, device=lengths.device) < lengths.unsqueeze(1)  # (B, T)
    return (token_logp * real).sum(1), lengths


def rescore(model, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
            candidates: list[list[list[int]]], pad_id: int = 0) -> list[list[int]]:
    """For each sentence, the candidate with the best log-probability per token under `model`.

    `candidates` holds l hypotheses per sentence (e.g. length parallel decoding of a NAT model).
    """
    l = len(candidates[0])
    rows = torch.arange(len(candidates), device=sources[0].device).repeat_interleave(l)
    flat = [hyp for per_sentence in candidates for hyp in per_sentence]
    logp, lengths = sequence_log_probs(model, [s.index_select(0, rows) for s in sources],
                                       [m.index_select(0, rows) for m in source_masks], prefix_id, eos_id, flat, pad_id)
    best = (logp / lengths).view(len(candidates), l).argmax(1).tolist()
    return [per_sentence[b] for per_sentence, b in zip(candidates, best)]


# ---- ensembles (e.g. Lee et al. 2019, §3.3: POSTECH's APE submissions) ---------------------------------

@dataclass
class MemberState:
    """One ensemble member's share of the memory or of the cache, reordered as a whole (beam search)."""

    parts: list  # that member's EncoderOut list, or its per-layer caches

    def index_select(self, index: Tensor, cross_index: Tensor | None = None) -> "MemberState":
        """Memory: rows `index`. Cache: as LayerCache.index_select (hypothesis rows, and the memory's rows)."""
        return MemberState([part.index_select(index) if isinstance(part, EncoderOut)
                            else part.index_select(index, cross_index) for part in self.parts])


@dataclass
class EnsembleOut:
    logits: Tensor  # (B, T, V) combined log-probabilities
    cache: list[MemberState]  # one per member
    cross_attention: list = ()


class Ensemble:
    """N autoregressive models decoding as one: each step combines the members' next-token distributions.

    It has the interface that greedy_search, beam_search, generate, sequence_log_probs, rescore and
    translate_encoded use (`encode`, `decode`, `generate`, `eval`), so any model with `encode` and an
    incremental `decode` can be a member, and members may be of different types (they must share the
    vocabulary). Memory and cache hold one `MemberState` per member.
        mode "logprob": logits = (1/N) sum_m log p_m          (OpenNMT-py's default, used by POSTECH)
        mode "prob":    logits = log (1/N) sum_m p_m          (OpenNMT-py's -avg_raw_probs; fairseq's)
    # Deviation: the searches apply log_softmax to every step's logits, so "logprob" decodes with the
    # renormalized mean, log_softmax((1/N) sum_m log p_m) = (1/N) sum_m log p_m - c (c >= 0 per row and step);
    # OpenNMT-py scores hypotheses with the unnormalized mean. The order of tokens within a step is the same.
    """

    def __init__(self, models: list, mode: str = "logprob"):
        if not models:
            raise MsgcoreError("an ensemble needs at least one model")
        if mode not in ("logprob", "prob"):
            raise MsgcoreError(f"Ensemble mode {mode!r}; use 'logprob' or 'prob'")
        self.models, self.mode = list(models), mode

    def eval(self) -> "Ensemble":
        for model in self.models:
            model.eval()
        return self

    def encode(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[MemberState]:
        return [MemberState(model.encode(sources, source_masks)) for model in self.models]

    def decode(self, tokens: Tensor, memory: list[MemberState], cache: list[MemberState] | None = None,
               start_pos: int = 0, need_weights: bool = False) -> EnsembleOut:
        """tokens (B, T) -> combined log-probabilities (B, T, V) in fp32 and the members' new caches."""
        cache = cache or [None] * len(self.models)
        log_probs, new_cache = [], []
        for model, member_memory, member_cache in zip(self.models, memory, cache):
            out = model.decode(tokens, member_memory.parts, member_cache.parts if member_cache else None, start_pos)
            log_probs.append(torch.log_softmax(out.logits.float(), dim=-1))  # (B, T, V) log p_m
            new_cache.append(MemberState(out.cache))
        stacked = torch.stack(log_probs)  # (N, B, T, V)
        if self.mode == "logprob":
            combined = stacked.mean(0)  # (1/N) sum_m log p_m
        else:
            combined = torch.logsumexp(stacked, 0) - math.log(len(self.models))  # log (1/N) sum_m p_m
        return EnsembleOut(combined, new_cache)

    def generate(self, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
                 cfg: GenerationConfig | None = None, forbidden: list[int] = ()) -> list[list[int]]:
        return generate(self, sources, source_masks, prefix_id, eos_id, cfg, forbidden)
