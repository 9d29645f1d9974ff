"""Golden numerics: a tiny deterministic training run's losses are pinned per `runcache.RESULTS_VERSION`.

The run cache serves a finished run whenever its key matches, and the key covers msgcore's code but not what
msgcore's code calls (a dependency's behaviour, a platform's kernels). A change that moves these losses without a
bump of RESULTS_VERSION would let the cache serve runs of the old numbers as if they were new: this test fails
first. When the change is meant, bump RESULTS_VERSION and pin the new losses here.
"""
import pytest
import torch

from msgcore import runcache
from msgcore.batching import encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.model import Transformer, preset
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import Trainer, TrainConfig

# RESULTS_VERSION -> {setting: the training loss after each of 6 updates}
GOLDEN = {
    2: {"fp32": [5.731114, 4.634455, 4.062908, 3.75916, 3.468017, 3.451349],
        "bf16+math": [5.735005, 4.636046, 4.063997, 3.760014, 3.468008, 3.451356]},
    3: {"fp32": [5.7363, 4.622527, 4.052763, 3.763246, 3.47946, 3.449729],  # dropout masks from msgcore.layers
        "bf16+math": [5.739933, 4.624273, 4.053899, 3.764471, 3.479275, 3.450182]},  # keep_mask, not bernoulli_
}
TOLERANCE = {"fp32": 1e-4, "bf16+math": 2e-3}  # relative: thread counts may reorder a float sum, nothing more


def tiny_run_losses(setting: str, tmp_path) -> list[float]:
    corpus = synthetic_corpus(400, num_sources=1, seed=0)
    tokenizer = Tokenizer.train(corpus.texts(), vocab_size=80, model_type="unigram", seed=0, cache_dir=tmp_path)
    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, dropout=0.1))
    amp = {"fp32": dict(amp="fp32"), "bf16+math": dict(amp="bf16", sdpa_backends=("math",))}[setting]
    cfg = TrainConfig(lr=2e-3, warmup_steps=3, max_tokens=1024, max_steps=6, max_epochs=10, log_every=1,
                      progress=False, seed=0, **amp)
    trainer = Trainer(model, tokenizer, encode_corpus(corpus, tokenizer), None, None, cfg, torch.device("cpu"),
                      tmp_path / "run")
    return [row["loss"] for row in trainer.train() if row["kind"] == "train"]


@pytest.mark.parametrize("setting", ["fp32", "bf16+math"])
def test_a_tiny_runs_losses_are_pinned_to_the_results_version(tmp_path, setting):
    assert runcache.RESULTS_VERSION in GOLDEN, (
        f"RESULTS_VERSION {runcache.RESULTS_VERSION} has no pinned losses: add {tiny_run_losses(setting, tmp_path)}")
    losses = tiny_run_losses(setting, tmp_path)
    assert losses == pytest.approx(GOLDEN[runcache.RESULTS_VERSION][setting], rel=TOLERANCE[setting]), (
        "training numerics changed: if this is meant, bump runcache.RESULTS_VERSION and pin the new losses "
        f"{losses}")
