"""Golden numerics: per model family, a tiny deterministic training run's losses are pinned per numerics version.

The run cache serves a finished run whenever its key matches, and the key covers msgcore's code but not what
msgcore's code calls (a dependency's behaviour, a platform's kernels), and the book's results stand as long as the
numerics versions they record (`msgcore.numerics`) are current. A change that moves a family's losses without a bump
of its version would let the old numbers pass for the new: this test fails first. When the change is meant, bump the
family's version (`runcache.RESULTS_VERSION` for "core", `numerics.FAMILIES[family]` for a model family) and pin the
new losses here.
"""
import pytest
import torch

from msgcore import numerics, runcache
from msgcore.batching import encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.experiments.marge import BOS, EOS, toy_documents
from msgcore.model import Transformer, preset
from msgcore.models.coverage_nat import CoverageNAT, CoverageNATConfig
from msgcore.models.marge import MargeConfig, MargeTransformer
from msgcore.models.mixrep import (MixRepConfig, MixRepTrainer, MixRepTransformer, encode_mixrep, tokenizer_texts,
                                   train_tokenizers)
from msgcore.models.postech_ape import PostechAPE, PostechConfig
from msgcore.models.trice import TriceConfig, TriceTransformer
from msgcore.retrieval import BatchConstructor, RetrievalConfig
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import Trainer, TrainConfig, numerics as numerics_context

# family -> its numerics version -> {setting: the training loss after each of 6 updates}
GOLDEN = {
    "core": {
        2: {"fp32": [5.731114, 4.634455, 4.062908, 3.75916, 3.468017, 3.451349],
            "bf16+math": [5.735005, 4.636046, 4.063997, 3.760014, 3.468008, 3.451356]},
        3: {"fp32": [5.7363, 4.622527, 4.052763, 3.763246, 3.47946, 3.449729],  # dropout masks from msgcore.layers
            "bf16+math": [5.739933, 4.624273, 4.053899, 3.764471, 3.479275, 3.450182]},  # keep_mask, not bernoulli_
    },
    "trice": {
        1: {"fp32": [5.105132, 4.891239, 4.605433, 4.230286, 4.100566, 4.188367],
            "bf16+math": [5.10617, 4.892375, 4.606093, 4.230639, 4.100882, 4.189267]},
    },
    "mixrep": {
        1: {"fp32": [4.734298, 4.560693, 4.361321, 4.306923, 4.148723, 4.001383],
            "bf16+math": [4.734999, 4.561162, 4.36188, 4.30749, 4.148971, 4.0016]},
    },
    "marge": {
        1: {"fp32": [4.098368, 4.170355, 3.554631, 3.506534, 2.904114, 3.724312],
            "bf16+math": [4.098089, 4.168656, 3.556332, 3.509662, 2.909149, 3.716573]},
    },
    "postech_ape": {
        1: {"fp32": [4.815633, 4.641821, 4.247358, 4.077253, 3.966126, 3.966],
            "bf16+math": [4.816251, 4.643198, 4.247461, 4.076212, 3.965365, 3.965918]},
    },
    "coverage_nat": {
        1: {"fp32": [4.671323, 4.515279, 4.375604, 4.065801, 3.906542, 3.942934],
            "bf16+math": [4.67036, 4.516267, 4.37469, 4.065503, 3.905926, 3.943262]},
    },
}
SETTINGS = {"fp32": dict(amp="fp32"), "bf16+math": dict(amp="bf16", sdpa_backends=("math",))}  # TrainConfig fields
TOLERANCE = {"fp32": 1e-4, "bf16+math": 2e-3}  # relative: thread counts may reorder a float sum, nothing more
TINY = dict(d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, dropout=0.1)  # the families' models
CPU = torch.device("cpu")


def where_to_bump(family: str) -> str:
    """The name of the version a meant change of `family`'s numbers bumps."""
    return "runcache.RESULTS_VERSION" if family == "core" else f"numerics.FAMILIES[{family!r}]"


def tokenized(corpus, tmp_path):
    """A unigram tokenizer trained on `corpus`, and the corpus encoded by it."""
    tokenizer = Tokenizer.train(corpus.texts(), vocab_size=80, model_type="unigram", seed=0, cache_dir=tmp_path)
    return tokenizer, encode_corpus(corpus, tokenizer)


def trainer_losses(model, tokenizer, data, setting: str, tmp_path, trainer_class=Trainer,
                   device: torch.device = CPU) -> list[float]:
    """The training loss after each of 6 updates of a Trainer on `data` (no validation)."""
    cfg = TrainConfig(lr=2e-3, warmup_steps=3, max_tokens=1024, max_steps=6, max_epochs=10, log_every=1,
                      progress=False, seed=0, **SETTINGS[setting])
    trainer = trainer_class(model, tokenizer, data, None, None, cfg, device, tmp_path / "run")
    return [round(row["loss"], 6) for row in trainer.train() if row["kind"] == "train"]


def adamw_losses(model, batches, setting: str) -> list[float]:
    """The loss per target token of each AdamW update over `batches`, under the Trainer's precision and kernels."""
    cfg = TrainConfig(**SETTINGS[setting])
    amp_dtype, backends = Trainer.resolve_amp(cfg.amp, CPU), Trainer.resolve_sdpa_backends(cfg.sdpa_backends, CPU)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    torch.manual_seed(0)  # the dropout stream
    model.train()
    losses = []
    for batch in batches:
        with numerics_context(CPU, amp_dtype, backends):  # the backward pass runs on the forward's kernels
            loss = model.loss(batch) / batch.num_target_tokens
            optimizer.zero_grad()
            loss.backward()
        optimizer.step()
        losses.append(round(loss.item(), 6))
    return losses


def core_losses(setting: str, tmp_path, device: torch.device = CPU) -> list[float]:
    """The shared Transformer on one source."""
    tokenizer, data = tokenized(synthetic_corpus(400, num_sources=1, seed=0), tmp_path)
    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, dropout=0.1))
    return trainer_losses(model, tokenizer, data, setting, tmp_path, device=device)


def trice_losses(setting: str, tmp_path) -> list[float]:
    """TRICE's stage 2 on two sources: coarse and fine encoders, separated cross-attention, the fine lr."""
    tokenizer, data = tokenized(synthetic_corpus(200, num_sources=2, seed=0), tmp_path)
    torch.manual_seed(0)
    model = TriceTransformer(TriceConfig(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, **TINY,
                                         fine_layers=1, base_lr=2e-3, fine_lr=4e-3))
    return trainer_losses(model, tokenizer, data, setting, tmp_path)


def mixrep_losses(setting: str, tmp_path) -> list[float]:
    """MixRep on two segmentations of one source: mixed encoders, two decoders, the drop-path gates on."""
    corpus = synthetic_corpus(200, num_sources=1, seed=0)
    pair = train_tokenizers(tokenizer_texts(corpus), vocab_size=60, cache_dir=tmp_path)
    torch.manual_seed(0)
    model = MixRepTransformer(MixRepConfig(vocab_size=pair.sp.vocab_size, bpe_vocab_size=pair.bpe.vocab_size,
                                           pad_id=pair.sp.pad_id, **TINY))
    return trainer_losses(model, pair, encode_mixrep(corpus, pair), setting, tmp_path, MixRepTrainer)


def marge_losses(setting: str, tmp_path) -> list[float]:
    """MARGE's pre-training on toy documents in two languages: batches retrieved by the initial model's relevance
    scores, the relevance bias in the decoder's cross-attention.

    One index for all 6 updates: an index rebuilt by a trained model picks its links among cosines a few 1e-5
    apart, where bf16's rounding (and another platform's) swaps links and jumps the loss by percents."""
    docs = toy_documents(40, num_languages=2, seed=0)
    torch.manual_seed(0)
    model = MargeTransformer(MargeConfig(vocab_size=len(docs.vocab), **TINY, relevance_layers=1,
                                         decoder_self_only_layers=1, beta_init=10.0))
    cfg = RetrievalConfig(refresh_every=6, num_shards=4, k_mono=0.5, k_cross=1, max_tokens=80, max_docs=8)
    stream = BatchConstructor(docs.pieces, docs.langs, docs.groups, docs.prefixes, cfg, BOS, EOS)
    return adamw_losses(model, [stream.next_batch(model) for _ in range(6)], setting)


def postech_ape_losses(setting: str, tmp_path) -> list[float]:
    """POSTECH APE on [src, mt]: the joint encoder, sequential multi-source attention, teacher-forcing ratio 0.9."""
    tokenizer, data = tokenized(synthetic_corpus(200, num_sources=2, seed=0), tmp_path)
    torch.manual_seed(0)
    model = PostechAPE(PostechConfig(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, **TINY,
                                     teacher_forcing_ratio=0.9))
    return trainer_losses(model, tokenizer, data, setting, tmp_path)


def coverage_nat_losses(setting: str, tmp_path) -> list[float]:
    """Coverage-NAT with two coverage iterations, the length loss and the sentence-level coverage loss.

    lambda starts at 5, not 1: an untrained model's attention is near uniform, so the coverage bias is near constant
    along a row and barely moves the softmax; at 1, halving the coverage moved these losses by only 1.4e-4."""
    tokenizer, data = tokenized(synthetic_corpus(200, num_sources=1, seed=0), tmp_path)
    torch.manual_seed(0)
    model = CoverageNAT(CoverageNATConfig(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, **TINY,
                                          max_length_offset=16, coverage_iterations=2, coverage_scale_init=5.0,
                                          coverage_weight=0.1))
    return trainer_losses(model, tokenizer, data, setting, tmp_path)


RUNS = {"core": core_losses, "trice": trice_losses, "mixrep": mixrep_losses, "marge": marge_losses,
        "postech_ape": postech_ape_losses, "coverage_nat": coverage_nat_losses}


@pytest.mark.parametrize("family", list(numerics.FAMILIES))
def test_every_family_has_losses_pinned_for_its_current_version(family, tmp_path):
    assert family in RUNS, f"numerics family {family!r} has no tiny run here: add one to RUNS and pin its losses"
    version = numerics.FAMILIES[family]
    if set(GOLDEN.get(family, {}).get(version, {})) != set(SETTINGS):
        losses = {setting: RUNS[family](setting, tmp_path / setting) for setting in SETTINGS}
        pytest.fail(f"{family} numerics {version} has no pinned losses: add GOLDEN[{family!r}][{version}] = {losses}")


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("family", list(RUNS))
def test_a_tiny_runs_losses_are_pinned_to_its_familys_numerics_version(family, setting, tmp_path):
    version = numerics.FAMILIES[family]
    losses = RUNS[family](setting, tmp_path)
    pinned = GOLDEN.get(family, {}).get(version, {}).get(setting)
    assert pinned is not None, f"{family} numerics {version} has no pinned {setting} losses: add {losses}"
    assert losses == pytest.approx(pinned, rel=TOLERANCE[setting]), (
        f"{family} training numerics changed: if this is meant, bump {where_to_bump(family)} and pin the new "
        f"losses {losses}")


# RESULTS_VERSION -> the core tiny run's losses in bf16 on a CUDA GPU (pinned from the first GPU that ran this test;
# its kernels sum in other orders than the CPU's, so the GPU has pins of its own)
CUDA_GOLDEN: dict[int, list[float]] = {}
CUDA_TOLERANCE = 5e-3  # relative


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU's own pins are checked on one")
def test_the_core_tiny_runs_losses_on_a_gpu_are_pinned_too(tmp_path):
    losses = core_losses("bf16+math", tmp_path, torch.device("cuda"))
    assert runcache.RESULTS_VERSION in CUDA_GOLDEN, (
        f"no CUDA losses pinned for RESULTS_VERSION {runcache.RESULTS_VERSION} ({torch.cuda.get_device_name()}): "
        f"pin CUDA_GOLDEN[{runcache.RESULTS_VERSION}] = {losses}")
    assert losses == pytest.approx(CUDA_GOLDEN[runcache.RESULTS_VERSION], rel=CUDA_TOLERANCE), (
        f"training numerics on the GPU changed: if this is meant, bump runcache.RESULTS_VERSION and pin {losses}")
