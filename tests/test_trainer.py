"""Training: overfitting a tiny set, exact resume, NaN detection, checkpoint errors, the LR schedule."""
import errno
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from msgcore.batching import encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.generation import GenerationConfig
from msgcore.metrics import corpus_score
from msgcore.model import Transformer, preset
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import Trainer, TrainConfig, inverse_sqrt, load_checkpoint, load_model, translate_encoded
from msgcore.utils import CheckpointError, TrainingError

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    corpus = synthetic_corpus(32, num_sources=1, seed=3)
    tokenizer = Tokenizer.train(corpus.texts(), vocab_size=60, cache_dir=tmp_path_factory.mktemp("tok"))
    return corpus, tokenizer, encode_corpus(corpus, tokenizer)


def tiny_model(tokenizer, dropout=0.1):
    torch.manual_seed(0)
    return Transformer(preset("tiny", vocab_size=tokenizer.vocab_size, d_model=64, d_ff=128, dropout=dropout))


CFG = TrainConfig(lr=3e-3, warmup_steps=20, max_tokens=400, max_epochs=1000, patience=0, log_every=5,
                  progress=False)


def test_tiny_model_overfits_32_pairs(toy, tmp_path):
    corpus, tokenizer, encoded = toy
    trainer = Trainer(tiny_model(tokenizer, dropout=0.0), tokenizer, encoded, None, None,
                      replace(CFG, max_steps=300, label_smoothing=0.0), CPU, tmp_path)
    trainer.train()
    hyps = translate_encoded(trainer.model, tokenizer, encoded, CPU, GenerationConfig(beam_size=1))
    assert corpus_score("bleu", hyps, corpus.target).score > 95


def test_resume_continues_exactly(toy, tmp_path):
    _, tokenizer, encoded = toy
    cfg = replace(CFG, max_steps=12, update_freq=2, max_tokens=150)  # several batches per epoch
    straight = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, cfg, CPU, tmp_path / "a")
    straight.train()

    first = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, replace(cfg, max_steps=5), CPU,
                    tmp_path / "b")
    first.train()
    first.save_checkpoint(tmp_path / "b" / "mid.pt")
    torch.manual_seed(1234)  # disturb the global RNG: resume must restore it
    resumed = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, cfg, CPU, tmp_path / "b")
    resumed.resume(tmp_path / "b" / "mid.pt")
    assert resumed.state.step == 5 and resumed.state.batch_in_epoch > 0
    resumed.train()

    for p, q in zip(straight.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    losses = lambda t: [r["loss"] for r in t.state.history if r["kind"] == "train"]  # noqa: E731
    assert losses(straight)[-1] == losses(resumed)[-1]


def test_a_resumed_run_counts_the_wall_time_of_its_interrupted_part(toy, tmp_path, monkeypatch):
    import time

    _, tokenizer, encoded = toy
    ticks = iter(range(0, 10 ** 6, 10))  # a clock that advances 10 s on every reading
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    first = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, replace(CFG, max_steps=5), CPU,
                    tmp_path)
    first.train()  # its last.pt holds the time it took
    spent = load_checkpoint(tmp_path / "last.pt")["state"]["wall_time_s"]
    assert spent > 0
    resumed = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, replace(CFG, max_steps=8), CPU,
                      tmp_path)
    resumed.resume(tmp_path / "last.pt")
    resumed.train()
    assert resumed.state.wall_time_s > spent  # goes on from the checkpoint, not from zero


def test_nan_loss_stops_with_the_step(toy, tmp_path):
    _, tokenizer, encoded = toy
    model = tiny_model(tokenizer)
    with torch.no_grad():
        model.token_embedding.weight[5] = float("nan")
    trainer = Trainer(model, tokenizer, encoded, None, None, replace(CFG, max_steps=3), CPU, tmp_path)
    with pytest.raises(TrainingError, match=r"loss is nan in steps 1–\d \(epoch 1\)"):  # read at log steps
        trainer.train()


def test_missing_and_corrupt_checkpoints_are_refused(toy, tmp_path):
    _, tokenizer, encoded = toy
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "nope.pt")
    trainer = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, replace(CFG, max_steps=1), CPU, tmp_path)
    trainer.train()
    good = tmp_path / "good.pt"
    trainer.save_checkpoint(good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": 1}, foreign)
    with pytest.raises(CheckpointError, match="not a msgcore checkpoint"):
        load_checkpoint(foreign)
    other = Trainer(Transformer(preset("tiny", vocab_size=tokenizer.vocab_size)), tokenizer, encoded, None, None,
                    CFG, CPU, tmp_path)
    with pytest.raises(CheckpointError, match="does not fit this model"):
        other.resume(good)


def test_load_model_rebuilds_the_same_translations(toy, tmp_path):
    _, tokenizer, encoded = toy
    trainer = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, replace(CFG, max_steps=20), CPU,
                      tmp_path)
    trainer.train()
    trainer.save_checkpoint(tmp_path / "m.pt")
    model, tok = load_model(tmp_path / "m.pt")
    cfg = GenerationConfig(beam_size=2)
    assert tok.to_bytes() == tokenizer.to_bytes()
    assert (translate_encoded(model, tok, encoded, CPU, cfg, limit=8)
            == translate_encoded(trainer.model, tokenizer, encoded, CPU, cfg, limit=8))


def test_checkpoint_write_is_atomic(toy, tmp_path, monkeypatch):
    _, tokenizer, encoded = toy
    trainer = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, CFG, CPU, tmp_path)

    def explode(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", explode)
    with pytest.raises(CheckpointError, match=r"^no space left on device while writing .*x.pt; the previous "
                                              r"checkpoint is intact$"):
        trainer.save_checkpoint(tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []


def test_a_kill_between_the_two_saves_leaves_best_pt_current(toy, tmp_path, monkeypatch):
    """best.pt is written first: a kill before last.pt never leaves best.pt older than the best recorded."""
    corpus, tokenizer, encoded = toy
    trainer = Trainer(tiny_model(tokenizer), tokenizer, encoded, encoded, corpus.target,
                      replace(CFG, max_steps=2, validate_every=2), CPU, tmp_path)
    save = Trainer.save_checkpoint

    def killed_before_last(self, path, **kw):
        if Path(path).name == "last.pt":
            raise KeyboardInterrupt
        save(self, path, **kw)
    monkeypatch.setattr(Trainer, "save_checkpoint", killed_before_last)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    best = load_checkpoint(tmp_path / "best.pt")["state"]
    assert best["step"] == best["best_step"] == 2 and not (tmp_path / "last.pt").exists()


def test_best_pt_holds_the_weights_without_the_optimizer_state(toy, tmp_path):
    """best.pt is read for its weights, never trained on: it leaves Adam's moments out (two thirds of a checkpoint),
    and loading it restores the best model and its record."""
    corpus, tokenizer, encoded = toy
    trainer = Trainer(tiny_model(tokenizer), tokenizer, encoded, encoded, corpus.target,
                      replace(CFG, max_steps=4, validate_every=4), CPU, tmp_path)
    trainer.train()
    best, last = load_checkpoint(tmp_path / "best.pt"), load_checkpoint(tmp_path / "last.pt")
    assert best["optimizer"] is None and last["optimizer"]["state"]
    assert (tmp_path / "best.pt").stat().st_size < 0.6 * (tmp_path / "last.pt").stat().st_size
    reader = Trainer(tiny_model(tokenizer), tokenizer, encoded, encoded, corpus.target, CFG, CPU, tmp_path / "r")
    reader.resume(tmp_path / "best.pt")
    assert reader.state.best_step == 4
    for p, q in zip(trainer.model.parameters(), reader.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_max_steps_between_validations_validates_the_last_step(toy, tmp_path):
    corpus, tokenizer, encoded = toy
    trainer = Trainer(tiny_model(tokenizer), tokenizer, encoded, encoded, corpus.target,
                      replace(CFG, max_steps=5, validate_every=4, max_tokens=150), CPU, tmp_path)
    trainer.train()
    assert [r["step"] for r in trainer.state.history if r["kind"] == "valid"] == [4, 5]


def test_save_every_writes_last_pt_between_validations(toy, tmp_path, monkeypatch):
    _, tokenizer, encoded = toy
    saved = []
    save = Trainer.save_checkpoint
    monkeypatch.setattr(Trainer, "save_checkpoint", lambda self, path: (saved.append(self.state.step), save(self, path)))
    trainer = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None,
                      replace(CFG, max_steps=5, save_every=2, max_tokens=150), CPU, tmp_path)
    trainer.train()
    assert saved == [2, 4, 5]


def test_inverse_sqrt_schedule():
    factor = inverse_sqrt(100)
    assert factor(0) == pytest.approx(0.01)
    assert factor(99) == pytest.approx(1.0)
    assert factor(399) == pytest.approx(0.5)


def test_constant_schedule_and_unknown_schedule_error():
    from msgcore.trainer import lr_schedule
    from msgcore.utils import TrainingError

    assert [lr_schedule("constant", 100)(step) for step in (0, 50, 5000)] == [1.0, 1.0, 1.0]
    assert lr_schedule("inverse_sqrt", 100)(99) == 1.0
    with pytest.raises(TrainingError, match="unknown schedule 'cosine'"):
        lr_schedule("cosine", 100)


def test_the_math_sdpa_kernel_computes_the_same_loss_and_is_the_one_used(toy, tmp_path, monkeypatch):
    _, tokenizer, encoded = toy
    batch = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, CFG, CPU, tmp_path).collate(
        encoded, list(range(8)))
    fused = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, CFG, CPU, tmp_path / "a")
    math_kernel = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None,
                          replace(CFG, sdpa_backends=("math",)), CPU, tmp_path / "b")
    fused.model.eval(), math_kernel.model.eval()  # no dropout: the two losses must agree
    assert torch.allclose(fused.loss_sum(batch), math_kernel.loss_sum(batch), rtol=1e-5)

    import torch.nn.functional as F
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):  # the flash kernel is refused inside the context: only MATH may run
        seen.append(torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled())
        return real(*args, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    math_kernel.loss_sum(batch)
    assert seen and all(seen)


def test_an_unknown_sdpa_backend_is_refused_before_training(toy, tmp_path):
    _, tokenizer, encoded = toy
    for bad in (("fast",), "math"):
        with pytest.raises(TrainingError, match="unknown sdpa_backends"):
            Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, replace(CFG, sdpa_backends=bad), CPU,
                    tmp_path / "x")
        assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


# ---- precision per device ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("capability, want", [((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                                              ((9, 0), torch.bfloat16)])
def test_auto_precision_follows_the_gpus_compute_capability(monkeypatch, capability, want):
    """A T4 (7.5) says is_bf16_supported() but only emulates bf16: it gets fp16 (with a GradScaler)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert Trainer.resolve_amp("auto", torch.device("cuda", 0)) == want
    assert Trainer.resolve_amp("auto", CPU) is None  # a CPU recipe asks for bf16 itself
    assert Trainer.resolve_amp("fp16", CPU) == torch.float16 and Trainer.resolve_amp("fp32", CPU) is None
    with pytest.raises(TrainingError, match="fp16"):
        Trainer.resolve_amp("half", CPU)


def test_an_fp16_step_whose_gradient_overflows_is_skipped_and_the_scale_halved(toy, tmp_path):
    corpus, tokenizer, encoded = toy
    trainer = Trainer(tiny_model(tokenizer), tokenizer, encoded, None, None, replace(CFG, amp="fp16", max_steps=2),
                      CPU, tmp_path)
    assert trainer.scaler is not None
    batch = [trainer.collate(encoded, list(range(8))).to(CPU)]
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    scale = trainer.scaler.get_scale()
    parameter = next(trainer.model.parameters())
    hook = parameter.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    trainer.train_step(batch)
    hook.remove()
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())  # the step was skipped
    assert trainer.scaler.get_scale() == scale / 2
    trainer.train_step(batch)  # a finite step updates the weights
    assert not all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    trainer.save_checkpoint(tmp_path / "last.pt")
    assert load_checkpoint(tmp_path / "last.pt")["scaler"]["scale"] == scale / 2  # a resume keeps the scale


def test_a_cpu_recipes_sdpa_kernel_does_not_follow_it_onto_a_gpu():
    from torch.nn.attention import SDPBackend

    assert Trainer.resolve_sdpa_backends(("math",), CPU) == [SDPBackend.MATH]
    assert Trainer.resolve_sdpa_backends(("math",), torch.device("cuda", 0)) == []  # torch's fused kernels there
    with pytest.raises(TrainingError, match="unknown sdpa_backends"):
        Trainer.resolve_sdpa_backends(("flashy",), torch.device("cuda", 0))  # still checked on every device
