"""The chunked label-smoothed cross-entropy equals torch's F.cross_entropy, in value and gradient."""
import pytest
import torch
import torch.nn.functional as F

from msgcore import loss as L


def reference(logits, target, ignore_index, eps):
    x = logits.detach().clone().requires_grad_()
    value = F.cross_entropy(x.float(), target, ignore_index=ignore_index, reduction="sum", label_smoothing=eps)
    value.backward()
    return value, x.grad


def ours(logits, target, ignore_index, eps):
    x = logits.detach().requires_grad_()
    value = L.LabelSmoothedCrossEntropy.apply(x, target, ignore_index, eps)  # the chunks, whatever the dtype
    value.backward()
    return value, x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("rows", [1, L.CHUNK_ROWS, 3 * L.CHUNK_ROWS + 17])  # one row, one chunk, a ragged tail
def test_value_and_gradient_equal_torchs(dtype, eps, rows):
    torch.manual_seed(rows)
    logits = (torch.randn(rows, 300) * 4).to(dtype)
    target = torch.randint(1, 300, (rows,))
    target[::5] = 0  # padding rows: no loss, no gradient
    want, want_grad = reference(logits, target, 0, eps)
    before = logits.clone()
    got, got_grad = ours(logits, target, 0, eps)
    assert torch.equal(logits, before)  # the input is never overwritten (an fp32 chunk is not a copy by itself)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-3)  # 1 bf16 ulp
    torch.testing.assert_close(got_grad.float(), want_grad.float(), **tolerance)
    assert got_grad.dtype == dtype and not got_grad[::5].any()


def test_the_gradient_scales_with_the_upstream_gradient():
    logits = torch.randn(10, 20, requires_grad=True)
    target = torch.randint(0, 20, (10,))
    (3.0 * L.LabelSmoothedCrossEntropy.apply(logits, target, -100, 0.1)).backward()
    want = logits.detach().clone().requires_grad_()
    (3.0 * F.cross_entropy(want, target, reduction="sum", label_smoothing=0.1)).backward()
    torch.testing.assert_close(logits.grad, want.grad)


def test_bf16_logits_on_a_cpu_take_the_chunks_and_fp32_logits_take_torchs_kernel(monkeypatch):
    logits, target = torch.randn(20, 30), torch.randint(0, 30, (20,))
    calls = []
    monkeypatch.setattr(L.LabelSmoothedCrossEntropy, "apply", lambda *a: calls.append(a[0].dtype) or a[0].sum())
    L.label_smoothed_cross_entropy(logits.requires_grad_(), target, 0, 0.1)
    L.label_smoothed_cross_entropy(logits.detach().to(torch.bfloat16).requires_grad_(), target, 0, 0.1)
    assert calls == [torch.bfloat16]


def test_without_autograd_only_the_loss_is_computed(monkeypatch):
    logits, target = torch.randn(300, 50).to(torch.bfloat16), torch.randint(0, 50, (300,))
    monkeypatch.setattr(L.LabelSmoothedCrossEntropy, "apply", lambda *a: pytest.fail("a gradient was computed"))
    with torch.no_grad():
        value = L.label_smoothed_cross_entropy(logits, target, 0, 0.1)
    torch.testing.assert_close(value, F.cross_entropy(logits.float(), target, ignore_index=0, reduction="sum",
                                                      label_smoothing=0.1))


def test_every_row_ignored_gives_zero_loss_and_gradient():
    logits = torch.randn(5, 7, requires_grad=True)
    value = L.LabelSmoothedCrossEntropy.apply(logits, torch.zeros(5, dtype=torch.long), 0, 0.1)
    value.backward()
    assert value.item() == 0.0 and not logits.grad.any()


def test_a_second_backward_through_the_in_place_gradient_is_refused_not_wrong():
    logits = torch.randn(6, 11).to(torch.bfloat16).requires_grad_()
    target = torch.tensor([1, 2, 3, 0, 5, 10])
    loss = L.label_smoothed_cross_entropy(logits, target, ignore_index=0, label_smoothing=0.1)
    (loss * 0.5).backward(retain_graph=True)
    _, expected = reference(logits, target, 0, 0.1)
    torch.testing.assert_close(logits.grad.float(), 0.5 * expected.float(), rtol=2e-2, atol=2e-3)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()  # the saved gradient was scaled in place: a second pass would be wrong, so torch refuses it
