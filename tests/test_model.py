"""The Transformer: masking, incremental decoding, presets, embeddings and hooks."""
from types import SimpleNamespace

import pytest
import torch

from msgcore.embeddings import sinusoid
from msgcore.model import Transformer, preset
from msgcore.utils import MsgcoreError


def tiny_model(pre_norm=True, **overrides):
    cfg = preset("tiny", vocab_size=50, d_model=32, d_ff=64, pre_norm=pre_norm, dropout=0.0, **overrides)
    return Transformer(cfg).eval()


def random_batch(B=3, S=7, T=6, vocab=50):
    src = torch.randint(4, vocab, (B, S))
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[0, 4:] = False
    src[~mask] = 0
    return SimpleNamespace(sources=[src], source_masks=[mask], target_in=torch.randint(4, vocab, (B, T)))


@pytest.mark.parametrize("pre_norm", [True, False])
def test_incremental_decoding_equals_full_forward(pre_norm):
    model, batch = tiny_model(pre_norm), random_batch()
    full = model(batch)  # (B, T, V)
    memory = model.encode(batch.sources, batch.source_masks)
    cache, steps = None, []
    for t in range(batch.target_in.size(1)):
        out = model.decode(batch.target_in[:, t:t + 1], memory, cache, start_pos=t)
        cache = out.cache
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)


def test_padded_source_tokens_do_not_change_outputs():
    model, batch = tiny_model(), random_batch()
    before = model(batch)
    batch.sources[0][0, 4:] = torch.randint(4, 50, (3,))  # rewrite the padding of sentence 0
    torch.testing.assert_close(model(batch), before)


def test_future_target_tokens_do_not_change_earlier_logits():
    model, batch = tiny_model(), random_batch()
    before = model(batch)
    batch.target_in[:, 3:] = torch.randint(4, 50, (3, 3))
    after = model(batch)
    torch.testing.assert_close(after[:, :3], before[:, :3])
    assert not torch.allclose(after[:, 3:], before[:, 3:])


def test_tied_embeddings_share_one_matrix():
    model = tiny_model()
    assert model.decoder.output_projection.weight is model.token_embedding.weight
    assert model.encoder.embed.tokens is model.token_embedding
    untied = tiny_model(tie_embeddings=False)
    assert untied.decoder.output_projection.weight is not untied.token_embedding.weight


def test_presets_and_unknown_preset():
    assert preset("base").d_model == 512 and preset("base").encoder_layers == 6
    assert preset("small", dropout=0.3).dropout == 0.3
    with pytest.raises(MsgcoreError, match="unknown preset 'huge'"):
        preset("huge")


def test_base_transformer_refuses_two_sources():
    model, batch = tiny_model(), random_batch()
    with pytest.raises(MsgcoreError, match="exactly 1 source, got 2"):
        model.encode(batch.sources * 2, batch.source_masks * 2)


def test_sinusoid_matches_paper_formula():
    pos, d = torch.tensor([3]), 8
    table = sinusoid(pos, d)[0]
    for i in range(d // 2):
        angle = 3 / 10000 ** (2 * i / d)
        assert table[2 * i].item() == pytest.approx(torch.sin(torch.tensor(angle)).item(), abs=1e-6)
        assert table[2 * i + 1].item() == pytest.approx(torch.cos(torch.tensor(angle)).item(), abs=1e-6)


def test_segment_embedding_changes_encoder_output():
    model, batch = tiny_model(), random_batch()
    tokens, mask = batch.sources[0], batch.source_masks[0]
    plain = model.encoder(tokens, mask).hidden
    segments = torch.zeros_like(tokens)
    shifted = model.encoder(tokens, mask, segment_ids=segments + 1).hidden
    assert not torch.allclose(shifted, plain)


def test_cross_attention_weights_are_returned_on_request():
    model, batch = tiny_model(), random_batch()
    memory = model.encode(batch.sources, batch.source_masks)
    out = model.decode(batch.target_in, memory, need_weights=True)
    assert len(out.cross_attention) == 2
    weights = out.cross_attention[0]  # (B, H, T, S)
    assert weights.shape == (3, 4, 6, 7)
    assert torch.all(weights[0, ..., 4:] == 0)
