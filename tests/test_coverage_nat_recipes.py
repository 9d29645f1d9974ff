"""Coverage-NAT recipes (msgcore/experiments/coverage_nat.py) on the toy corpus and hand-made outputs."""
import pytest
import torch

from msgcore.batching import collate, encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.experiments import TranslationData
from msgcore.experiments.coverage_nat import (NATScale, bleu_by_length, bleu_with_and_without_dedup, distill,
                                              latency, repeats_by_half, train_nat, translate_lpd, translate_nat)
from msgcore.generation import GenerationConfig
from msgcore.model import Transformer, preset
from msgcore.models.coverage_nat import generate_nat
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import TrainConfig, translate_encoded
from msgcore.utils import MsgcoreError

CPU = torch.device("cpu")
STEPS = TrainConfig(lr=3e-3, warmup_steps=2, max_tokens=500, max_epochs=1, patience=0, log_every=1, progress=False)
SCALE = NATScale("tiny", dict(d_model=32, d_ff=64, dropout=0.0, max_length_offset=16), STEPS, STEPS,
                 TrainConfig(**{**vars(STEPS), "lr": 1e-4, "schedule": "constant"}),
                 coverage_iterations=2, beta=0.5, teacher_beam=2, lpd_candidates=3)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    corpora = {s: synthetic_corpus(40 if s == "train" else 10, num_sources=1, seed=0, split=s) for s in ("train", "val")}
    tok = Tokenizer.train(corpora["train"].texts(), vocab_size=60, cache_dir=tmp_path_factory.mktemp("tok"))
    return TranslationData(tok, corpora, {s: encode_corpus(c, tok) for s, c in corpora.items()})


def teacher(data):
    torch.manual_seed(0)
    return Transformer(preset("tiny", vocab_size=data.tokenizer.vocab_size, d_model=32, d_ff=64, dropout=0.0)).eval()


def test_distilled_targets_are_the_teachers_translations(data):
    model = teacher(data)
    kd = distill(model, data, SCALE, CPU, split="val")
    hyps = translate_encoded(model, data.tokenizer, data.encoded["val"], CPU, GenerationConfig(beam_size=2))
    assert kd.sources == data.encoded["val"].sources
    assert kd.target == [data.tokenizer.encode(h) or [data.tokenizer.unk_id] for h in hyps]


def test_two_phases_add_sca_at_a_constant_learning_rate(data, tmp_path):
    phase1, phase2 = train_nat(data, SCALE, CPU, tmp_path / "nat")
    assert phase1.model.cfg.coverage_weight == 0 and phase2.model.cfg.coverage_weight == 0.5
    lrs = {row["lr"] for row in phase2.history if row["kind"] == "train"}
    assert lrs == {1e-4}
    base1, base2 = train_nat(data, SCALE, CPU, tmp_path / "base", use_coverage=False)
    assert base2 is None and not base1.model.cfg.use_coverage


def test_translate_nat_and_lpd_keep_corpus_order(data, tmp_path):
    phase1, _ = train_nat(data, SCALE, CPU, tmp_path / "nat", beta=0)
    model = phase1.model
    outputs = translate_nat(model, data, "val", CPU)
    batch = collate(data.encoded["val"], range(10))
    assert outputs == generate_nat(model, batch.sources, batch.source_masks, forbidden=[0, 2])
    chosen = translate_lpd(model, teacher(data), data, "val", SCALE, CPU)
    assert len(chosen) == 10
    scores = bleu_with_and_without_dedup(outputs, data, "val")
    assert set(scores) == {"BLEU", "BLEU (dedup)", "repeats %"}


def test_latency_is_the_median_after_warmup():
    calls, delays = [], [0.0, 0.0, 0.02, 0.0, 0.0]

    def translate_one(i):
        calls.append(i)
        if len(calls) > 2:  # the two warm-up calls are not timed
            import time
            time.sleep(delays[i])

    assert latency(translate_one, 5, CPU, warmup=2) < 0.01  # the median ignores the one slow sentence
    assert calls == [0, 1, 0, 1, 2, 3, 4]
    with pytest.raises(MsgcoreError, match="at least one"):
        latency(translate_one, 0, CPU)


def test_repeats_by_half_and_bleu_by_length():
    outputs = [[1, 1, 2], [3, 4], [5, 5, 5, 6], [7, 8]]
    lengths = [2, 3, 9, 10]
    ratios = repeats_by_half(outputs, lengths)
    assert ratios == pytest.approx({"short": 100 / 5, "long": 200 / 6, "all": 300 / 11})
    buckets = bleu_by_length(["a b c d", "x y z w", "a b c d"], ["a b c d", "a b c d", "a b c d"], [3, 12, 25], [0, 10, 20])
    assert list(buckets) == ["0-9", "10-19", "20+"]
    assert buckets["0-9"] == pytest.approx(100) and buckets["10-19"] == pytest.approx(0)


def test_limit_eval_splits_keeps_train_whole(data):
    from msgcore.experiments.coverage_nat import limit_eval_splits

    small = limit_eval_splits(data, 3)
    assert len(small.corpora["train"]) == 40 and len(small.encoded["train"]) == 40
    assert len(small.corpora["val"]) == 3 and len(small.encoded["val"]) == 3
    assert small.encoded["val"].sources[0] == data.encoded["val"].sources[0][:3]
    assert limit_eval_splits(data, 0) is data


def test_a_direction_trains_its_teacher_and_distils_with_it(data, tmp_path):
    from msgcore.experiments.coverage_nat import train_direction

    direction = train_direction(data, SCALE, CPU, tmp_path, split="val")
    assert direction.name == "Xa→Xt" and direction.key == "xa-xt"
    assert (tmp_path / "teacher" / "best.pt").is_file()
    hyps = translate_encoded(direction.teacher, data.tokenizer, data.encoded["val"], CPU,
                             GenerationConfig(beam_size=SCALE.test_beam))
    assert direction.teacher_hyps == hyps
    assert direction.distilled.target == distill(direction.teacher, data, SCALE, CPU).target


def test_table2_scores_every_seed_and_times_every_system(data, tmp_path):
    from msgcore.experiments.coverage_nat import AT, lpd_name, table2, train_direction, train_main_systems

    direction = train_direction(data, SCALE, CPU, tmp_path, split="val")
    runs = train_main_systems(direction, SCALE, CPU, tmp_path, seeds=(0, 1))
    assert set(runs) == {(name, s) for name in ("NAT-Base", "Coverage-NAT w/o SCA", "Coverage-NAT") for s in (0, 1)}
    assert runs["Coverage-NAT", 1].model.cfg.coverage_weight == SCALE.beta
    table = table2(direction, runs, SCALE, CPU, seeds=(0, 1), n_latency=3)
    systems = [AT, "NAT-Base", "Coverage-NAT", lpd_name(SCALE)]
    assert list(table.scores) == systems and set(table.latency) == set(systems)
    assert [len(table.scores[name]) for name in systems] == [1, 2, 2, 1]
    assert table.outputs["Coverage-NAT", 1] == translate_nat(runs["Coverage-NAT", 1].model, data, "val", CPU)
    frame = table.frame()
    assert frame.loc[AT, "speedup"] == "1.0×" and frame.loc["NAT-Base", "runs"] == 2
    assert "±" in frame.loc["NAT-Base", "BLEU"] and "±" not in frame.loc[AT, "BLEU"]
