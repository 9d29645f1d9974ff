"""msgcore.layers.Dropout: inverted dropout with a mask of 16-bit random lanes on a CPU."""
import pytest
import torch

from msgcore.layers import Dropout, keep_mask
from msgcore.utils import MsgcoreError, keep_freed_memory


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_the_drop_rate_is_p_and_kept_elements_are_scaled(p):
    dropout = Dropout(p).train()
    x = torch.ones(400, 500)
    y = dropout(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 0.005  # 200,000 draws: 4 standard deviations is under 0.005
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / (1 - p)))


def test_every_lane_of_a_draw_is_uniform():
    mask = keep_mask(torch.Size([400_000]), 0.25, torch.device("cpu")).view(-1, 4)  # the 4 lanes of each int64
    rates = 1 - mask.float().mean(0)
    assert torch.all((rates - 0.25).abs() < 0.006), rates  # before: a draw's top lane had its sign bit fixed


def test_the_gradient_passes_where_the_forward_kept():
    dropout = Dropout(0.4).train()
    x = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
    y = dropout(x)
    y.sum().backward()
    kept = y != 0
    torch.testing.assert_close(x.grad[kept].float(), torch.full_like(x.grad[kept].float(), 1 / 0.6), rtol=1e-2,
                               atol=0)
    assert (x.grad[~kept & (x != 0)] == 0).all()


def test_eval_mode_and_p_zero_are_the_identity_and_a_bad_p_is_refused():
    x = torch.randn(8, 8)
    assert Dropout(0.5).eval()(x) is x and Dropout(0.0).train()(x) is x
    with pytest.raises(MsgcoreError, match="out of range"):
        Dropout(1.0)


def test_a_seed_gives_the_same_mask():
    torch.manual_seed(3)
    first = keep_mask(torch.Size([1000]), 0.1, torch.device("cpu"))
    torch.manual_seed(3)
    assert torch.equal(first, keep_mask(torch.Size([1000]), 0.1, torch.device("cpu")))


def test_the_allocator_setting_applies_on_linux_and_memory_still_works():
    import platform

    assert keep_freed_memory() == (platform.system() == "Linux")
    big = torch.ones(4096, 8000)  # 131 MB: served from the heap now, and freed back to it
    assert big.sum().item() == 4096 * 8000
