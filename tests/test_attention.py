"""The attention module: SDPA == math path, masking, the KV cache, and parity with torch.nn."""
import torch

from msgcore.attention import MultiHeadAttention, attention_math, causal_mask


def make_attention(d=32, h=4):
    return MultiHeadAttention(d, h).eval()


def test_sdpa_equals_math_path_with_padding_mask():
    attn = make_attention()
    x, memory = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[0, ..., 4:] = False
    fast, _, none = attn(x, memory, mask)
    slow, _, weights = attn(x, memory, mask, need_weights=True)
    assert none is None
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    assert weights.shape == (3, 4, 5, 7)
    assert torch.all(weights[0, ..., 4:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 5))


def test_sdpa_equals_math_path_causal():
    attn = make_attention()
    x = torch.randn(2, 6, 32)
    fast, _, _ = attn(x, causal=True)
    slow, _, weights = attn(x, causal=True, need_weights=True)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    assert torch.all(weights.triu(1) == 0)


def test_causal_output_ignores_future_tokens():
    attn = make_attention()
    x = torch.randn(1, 6, 32)
    changed = x.clone()
    changed[:, 4:] = torch.randn(1, 2, 32)
    out, _, _ = attn(x, causal=True)
    out2, _, _ = attn(changed, causal=True)
    torch.testing.assert_close(out[:, :4], out2[:, :4])
    assert not torch.allclose(out[:, 4:], out2[:, 4:])


def test_padded_keys_do_not_change_outputs():
    attn = make_attention()
    x, memory = torch.randn(1, 3, 32), torch.randn(1, 5, 32)
    mask = torch.tensor([True, True, True, False, False])[None, None, None, :]
    out, _, _ = attn(x, memory, mask)
    memory2 = memory.clone()
    memory2[:, 3:] = 100 * torch.randn(1, 2, 32)
    out2, _, _ = attn(x, memory2, mask)
    torch.testing.assert_close(out, out2)


def test_incremental_self_attention_equals_full():
    attn = make_attention()
    x = torch.randn(2, 5, 32)
    full, _, _ = attn(x, causal=True)
    cache, steps = None, []
    for t in range(5):
        out, cache, _ = attn(x[:, t:t + 1], cache=cache, causal=True)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache[0].shape == (2, 4, 5, 8)


def test_cross_attention_cache_is_reused_not_recomputed():
    attn = make_attention()
    x, memory = torch.randn(2, 1, 32), torch.randn(2, 7, 32)
    out, cache, _ = attn(x, memory)
    out2, cache2, _ = attn(x, memory * 0, cache=cache)  # the cache wins over `memory`
    assert cache2[0] is cache[0]
    torch.testing.assert_close(out, out2)


def test_causal_mask_with_cached_prefix():
    assert causal_mask(2, 4, torch.device("cpu")).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_matches_torch_multihead_attention():
    ours = make_attention(16, 2)
    theirs = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    with torch.no_grad():
        q, k, v = theirs.in_proj_weight.chunk(3)
        bq, bk, bv = theirs.in_proj_bias.chunk(3)
        for proj, w, b in ((ours.q_proj, q, bq), (ours.k_proj, k, bk), (ours.v_proj, v, bv)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 4, 16)
    pad = torch.tensor([[False, False, True, True], [False] * 4])  # torch: True = ignore
    expected, _ = theirs(x, memory, memory, key_padding_mask=pad)
    got, _, _ = ours(x, memory, (~pad)[:, None, None, :])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_attention_math_weights_rows_sum_to_one():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    out, weights = attention_math(q, k, v)
    assert out.shape == (1, 2, 3, 4)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, 3))


def test_hypotheses_sharing_a_memory_row_equal_a_memory_repeated_per_hypothesis():
    """Beam search: g query rows per memory row attend as if each had its own copy of the memory."""
    attn, g = make_attention(), 3
    memory, mask = torch.randn(2, 6, 32), torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    rows = torch.arange(2).repeat_interleave(g)
    cache = cache_repeated = None
    for x in torch.randn(2, 2 * g, 1, 32):  # two decoding steps over the cross-attention cache
        out, cache, weights = attn(x, memory, mask, cache=cache, need_weights=True)
        expected, cache_repeated, expected_weights = attn(x, memory[rows], mask[rows], cache=cache_repeated,
                                                          need_weights=True)
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(attn(x, memory, mask, cache=cache)[0], out)  # the SDPA path too
    assert cache[0].shape == (2, 4, 6, 8)  # the keys of a sentence are kept once, not once per hypothesis
    assert weights[g:, :, :, 4:].abs().max() == 0  # sentence 1's padding, for each of its hypotheses


def test_query_rows_that_do_not_share_memory_rows_evenly_are_refused():
    attn = make_attention()
    try:
        attn(torch.randn(5, 1, 32), torch.randn(2, 6, 32))
    except ValueError as error:
        assert "5 query rows for 2 memory rows" in str(error)
    else:
        raise AssertionError("5 query rows over 2 memory rows were accepted")


def test_a_reordered_cache_takes_the_next_step_in_place_and_equals_reorder_then_concatenate():
    from msgcore.attention import append_to_cache, reorder_with_room

    cached, new, index = torch.randn(4, 2, 5, 8), torch.randn(3, 2, 1, 8), torch.tensor([2, 2, 0])
    reordered = reorder_with_room(cached, index)
    assert torch.equal(reordered, cached[index])
    appended = append_to_cache(reordered, new)
    assert torch.equal(appended, torch.cat([cached[index], new], 2))
    assert appended.data_ptr() == reordered.data_ptr() and appended.is_contiguous()  # written into the room
    # a cache without room (a plain tensor, or one already extended) is concatenated, never written over
    again = append_to_cache(appended, torch.zeros(3, 2, 1, 8))
    assert again.data_ptr() != appended.data_ptr() and torch.equal(appended[:, :, 5:], new)
    branch = append_to_cache(reordered, torch.zeros(3, 2, 1, 8))  # a second step from the same reordered cache
    assert torch.equal(appended[:, :, 5:], new) and torch.equal(branch[:, :, 5:], torch.zeros(3, 2, 1, 8))
    first, second = append_to_cache(cached, new[:1].expand(4, -1, -1, -1)), append_to_cache(cached, -cached[:, :, :1])
    assert torch.equal(first[:, :, :5], cached) and torch.equal(second[:, :, 5:], -cached[:, :, :1])


def test_beam_steps_over_a_reordered_cache_equal_steps_over_a_concatenated_one():
    from msgcore.attention import reorder_with_room
    from msgcore.model import Transformer, preset

    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=20, d_model=32, d_ff=64, dropout=0.0)).eval()
    memory = model.encode([torch.randint(4, 20, (3, 6))], [torch.ones(3, 6, dtype=torch.bool)])
    tokens, index = torch.randint(4, 20, (3, 4)), torch.tensor([1, 1, 0])
    with torch.no_grad():
        check_reordered_steps(model, memory, tokens, index)
    assert reorder_with_room(torch.ones(2, 1, 3, 4, requires_grad=True), index[:1]).grad_fn is not None  # autograd


def check_reordered_steps(model, memory, tokens, index):
    from msgcore.layers import LayerCache

    out = model.decode(tokens[:, :3], memory)
    reordered = [c.index_select(index) for c in out.cache]
    stepped = model.decode(tokens[index, 3:], memory, reordered, start_pos=3)
    assert stepped.cache[0].self_kv[0].data_ptr() == reordered[0].self_kv[0].data_ptr()  # appended in place
    concatenated = [LayerCache(tuple(t.index_select(0, index).contiguous() for t in c.self_kv), c.cross_kv)
                    for c in out.cache]
    expected = model.decode(tokens[index, 3:], memory, concatenated, start_pos=3)
    assert torch.equal(stepped.logits, expected.logits)


def test_on_a_gpu_sdpa_may_pick_every_kernel_but_cudnns_and_on_a_cpu_it_is_torchs_call():
    from torch.nn.attention import SDPBackend

    from msgcore.attention import GPU_SDPA_BACKENDS, sdpa

    assert SDPBackend.CUDNN_ATTENTION not in GPU_SDPA_BACKENDS and SDPBackend.MATH in GPU_SDPA_BACKENDS
    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5) > 0.3
    mask[..., 0] = True  # every query row has a key
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(sdpa(q, k, v, mask, 0.0, False), expected)
