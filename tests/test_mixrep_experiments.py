"""Chapter 2's recipes (msgcore/experiments/mixrep.py): the scales, chapter 0's run as the SP baseline, the
co-teaching and self-training data, stage 2, the analyses, and the whole chapter on a toy scale (offline)."""
import statistics
import urllib.error
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from msgcore import chapters, download, experiments, recipes, runcache, verdicts
from msgcore.batching import collate
from msgcore.experiments import BASELINE_SCALES, Scale, baseline_data, run_key, train_translation
from msgcore.experiments import mixrep as mx
from msgcore.experiments.mixrep import BPE, SP
from msgcore.generation import GenerationConfig
from msgcore.model import Transformer, preset
from msgcore.models.mixrep import MixRepCorpus, MixRepTransformer, check_same_text
from msgcore.trainer import TrainConfig, translate_encoded
from msgcore.utils import MsgcoreError

CPU = torch.device("cpu")
STEPS = TrainConfig(lr=3e-3, warmup_steps=2, max_tokens=400, max_epochs=1, max_steps=3, patience=0,
                    valid_max_sentences=4, log_every=1, progress=False)
TOY = Scale("tiny", dict(d_model=32, d_ff=64, n_heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0), STEPS,
            vocab_size=120, train_examples=120, test_examples=6, beam_size=2, max_len=24)


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No data files and no network: the smoke path falls back to the seeded toy corpus."""
    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    monkeypatch.setattr(download.urllib.request, "urlopen", lambda url, timeout: (_ for _ in ()).throw(
        urllib.error.URLError("offline")))


@pytest.fixture
def toy_direction(offline):
    return mx.prepare_direction("de", "en", TOY, 0, allow_synthetic=True)


def captured_keys(monkeypatch) -> list[str]:
    """Replace train_model (in chapter 0's module and chapter 2's) by one that records the run-cache key."""
    keys = []

    def fake(model, data, cfg, device, out_dir, train=None, valid=None, trainer_class=None):
        keys.append(run_key(model, cfg, train or data.encoded["train"], valid or data.encoded["val"],
                            data.corpora["val"].target))
    monkeypatch.setattr(recipes, "train_model", fake)
    monkeypatch.setattr(mx, "train_model", fake)
    return keys


# ---- the SP baseline is chapter 0's run ----------------------------------------------------------------

def test_the_narrow_sp_baseline_is_chapter0s_run_and_comes_from_the_cache(toy_direction, tmp_path):
    chapter0 = baseline_data(TOY, 0, allow_synthetic=True)["De→En"]
    assert toy_direction.tokenizers.sp.to_bytes() == chapter0.tokenizer.to_bytes()
    first = train_translation(chapter0, TOY, CPU, tmp_path / "ch00", seed=0)  # chapter 0 ran first
    ours = mx.train_transformer(toy_direction.data[SP], TOY, CPU, tmp_path / "ch02", 0)
    assert not first.reused and ours.reused and ours.out_dir == first.out_dir
    bpe = mx.train_transformer(toy_direction.data[BPE], TOY, CPU, tmp_path / "bpe", 0)
    assert not bpe.reused  # the BPE baseline is a run of its own


@pytest.mark.skipif(download.mirror_dir() is None, reason="no local data mirror")
def test_at_small_scale_the_narrow_sp_key_is_the_key_chapter_0_trains_under(monkeypatch, tmp_path):
    """The real `small` recipe on Multi30k, without training: chapter 0's own function and ours ask for one key."""
    keys = captured_keys(monkeypatch)
    recipe = BASELINE_SCALES["small"]
    train_translation(baseline_data(recipe, 0)["De→En"], recipe, CPU, tmp_path, seed=0)
    direction = mx.prepare_direction("de", "en", recipe, 0)
    mx.train_transformer(direction.data[SP], recipe, CPU, tmp_path, 0)
    mx.train_transformer(direction.data[BPE], recipe, CPU, tmp_path, 0)
    assert keys[0] == keys[1] != keys[2]
    assert direction.data["mix"].encoded["train"].target == direction.data[SP].encoded["train"].target


# ---- scales and options --------------------------------------------------------------------------------

def test_bad_options_are_one_line_errors(monkeypatch):
    checks = [(lambda: mx.check_options("medium", 0), "unknown scale 'medium'"),
              (lambda: mx.check_options("small", -1), "seed = -1")]
    monkeypatch.setitem(mx.MIXREP_SCALES, "odd", replace(mx.MIXREP_SCALES["small"], directions=(("de", "fr"),)))
    checks.append((lambda: mx.check_options("odd", 0), "unknown direction de→fr"))
    monkeypatch.setitem(mx.MIXREP_SCALES, "odder", replace(mx.MIXREP_SCALES["small"], extra_directions=(("en", "ja"),)))
    checks.append((lambda: mx.check_options("odder", 0), "unknown direction en→ja"))
    no_wide = replace(mx.MIXREP_SCALES["small"], extra_directions=(("de", "en"),))
    monkeypatch.setitem(mx.MIXREP_SCALES, "no-wide", no_wide)
    checks.append((lambda: mx.check_options("no-wide", 0), "without the wide Transformer"))
    for call, message in checks:
        with pytest.raises(MsgcoreError, match=message) as error:
            call()
        assert "\n" not in str(error.value)


def test_scales_follow_chapter_0_and_the_wide_baseline_outweighs_mixrep():
    small, full = mx.MIXREP_SCALES["small"], mx.MIXREP_SCALES["full"]
    assert mx.chapter_recipe(small) is BASELINE_SCALES["small"]  # every small run is chapter 0's recipe
    assert small.directions == (("de", "en"),) and small.seeds == 3 and small.baselines == (SP,)  # chapter 0's seeds
    assert small.co_teaching is None and small.wide is None
    assert small.mixrep_train == {} and full.mixrep_train == {}  # chapter 0's recipe, its kernel included
    assert full.seeds == 3 and set(full.directions) == {("de", "en"), ("en", "de")} and BPE in full.baselines
    assert full.curve_sizes == (5000, 10000) and full.co_teaching.max_epochs == 10
    smoke = mx.MIXREP_SCALES["smoke"]
    capped = mx.chapter_recipe(smoke)  # smoke's caps reach every run's recipe
    assert capped.train.max_steps == smoke.run_steps and capped.train.valid_max_sentences == smoke.valid_sentences
    assert capped.train_examples == smoke.train_examples and capped.test_examples == smoke.test_examples
    assert max(smoke.curve_sizes) < smoke.train_examples  # a learning-curve point is less than all the data
    for scale in (mx.MIXREP_SCALES["smoke"], full):
        recipe = mx.chapter_recipe(scale)
        pair = SimpleNamespace(bpe=SimpleNamespace(vocab_size=8000), sp=SimpleNamespace(vocab_size=8000))
        mixrep = mx.mixrep_model(pair, recipe, 0).num_params()
        wide = Transformer(preset(recipe.preset, vocab_size=8000, **{**recipe.model, **scale.wide})).num_params()
        assert wide >= mixrep, (scale.baseline, wide, mixrep)


# ---- data helpers ----------------------------------------------------------------------------------------

def test_both_tokenizations_hold_the_same_sentences(toy_direction):
    mix, sp, bpe = (toy_direction.data[k] for k in ("mix", SP, BPE))
    assert mix.encoded["val"].sources[1] == sp.encoded["val"].sources[0]
    assert mix.encoded["val"].sources[0] == bpe.encoded["val"].sources[0]
    assert mix.encoded["val"].bpe_target == bpe.encoded["val"].target
    check_same_text(mix.encoded["val"], toy_direction.tokenizers)
    short = mx.head(mix.encoded["train"], 5)
    assert isinstance(short, MixRepCorpus) and len(short) == 5 and len(short.bpe_target) == 5
    assert len(mx.head(sp.encoded["train"], 7)) == 7


def small_train(data, n=8):
    return replace(data, encoded={**data.encoded, "train": mx.head(data.encoded["train"], n)})


def test_co_teaching_data_doubles_the_set_in_the_right_segmentations_and_is_built_once(toy_direction, monkeypatch):
    pair, data = toy_direction.tokenizers, small_train(toy_direction.data["mix"])
    model = mx.mixrep_model(pair, TOY, 0).eval()
    union = mx.co_teaching_data(model, data, 2, CPU)
    train = data.encoded["train"]
    assert len(union) == 16 and union.sources == [column * 2 for column in train.sources]
    assert union.target[:8] == train.target and union.bpe_target[:8] == train.bpe_target
    batch = collate(train, range(8))
    texts = {s: model.stream(s).generate(batch.sources, batch.source_masks, train.target_prefix, train.eos_id,
                                         GenerationConfig(beam_size=2), [0, 2]) for s in ("bpe", "sp")}
    assert union.target[8:] == pair.sp.encode_batch(pair.bpe.decode_batch(texts["bpe"]))  # y^_{bpe->sp}
    assert union.bpe_target[8:] == pair.bpe.encode_batch(pair.sp.decode_batch(texts["sp"]))  # y^_{sp->bpe}
    monkeypatch.setattr(mx, "co_teaching_corpus", lambda *a, **k: pytest.fail("translated the training set twice"))
    assert mx.co_teaching_data(model, data, 2, CPU).target == union.target  # from the run cache
    real, built = runcache.module_syntax, []
    monkeypatch.setattr(runcache, "module_syntax", lambda name: real(name) + ("#" if name == mx.MixRepTrainer.__module__
                                                                               else ""))
    monkeypatch.setattr(mx, "co_teaching_corpus", lambda *a, **k: built.append(1) or union)
    mx.co_teaching_data(model, data, 2, CPU)
    assert built  # MixRep's code (its model, data and trainer) changed: the data is built again


def test_self_training_data_is_the_models_own_translations_built_once(toy_direction, monkeypatch):
    data = small_train(toy_direction.data[SP])
    model = mx.transformer(data, TOY, 0).eval()
    union = mx.self_training_data(model, data, 2, CPU)
    train, tok = data.encoded["train"], data.tokenizer
    hyps = translate_encoded(model, tok, train, CPU, GenerationConfig(beam_size=2))
    assert len(union) == 16 and union.target == train.target + tok.encode_batch(hyps)
    assert union.sources == [column * 2 for column in train.sources]
    monkeypatch.setattr(mx, "translate_encoded", lambda *a, **k: pytest.fail("translated the training set twice"))
    assert mx.self_training_data(model, data, 2, CPU).target == union.target


def test_stage_2_starts_from_the_stage_1_model_with_a_fresh_optimizer(toy_direction, tmp_path, monkeypatch):
    data = small_train(toy_direction.data["mix"], 30)
    stage1 = mx.train_mixrep(data, TOY, CPU, tmp_path / "s1", 0)
    union = mx.co_teaching_data(stage1.model, data, 1, CPU)
    cfg = replace(STEPS, max_steps=2, warmup_steps=4)
    stage2 = mx.continue_training(stage1, data, union, cfg, CPU, tmp_path / "s2", 0)
    assert isinstance(stage2.model, MixRepTransformer) and not stage2.reused
    lrs = [row["lr"] for row in stage2.history if row["kind"] == "train"]
    assert lrs[0] == pytest.approx(cfg.lr * 2 / 4)  # the warmup starts again (the code's --reset-lr-scheduler)
    seen = []
    monkeypatch.setattr(mx, "train_model", lambda model, *a, **k: seen.append(model.state_dict()))
    mx.continue_training(stage1, data, union, cfg, CPU, tmp_path / "s3", 0)
    for key, value in stage1.model.state_dict().items():
        assert torch.equal(seen[0][key], value), key


# ---- the claims, declared before any run ------------------------------------------------------------------

def test_the_claims_are_declared_as_data_the_same_at_every_scale():
    declared = {name: mx.declared_claims(name) for name in mx.MIXREP_SCALES}
    ids = [c.id for c in declared["full"]]
    assert len(ids) == len(set(ids)) == 29 and all([c.id for c in cs] == ids for cs in declared.values())
    for scale, claims in declared.items():
        for c in claims:
            assert c.kind in ("better", "parity") and c.metric == "BLEU"
            assert c.test_set == mx.MIXREP_SCALES[scale].test_split
            assert c.cost.startswith("cost: not measured") and "GPU" in c.cost  # no rate is known before the runs
            if not c.id.startswith("§1"):  # a generation claim: the system must clear copying and the constant
                assert c.floors == tuple(mx.floor_name(f, c.id.split()[-1]) for f in mx.FLOORS)
    by_id = {c.id: c for c in declared["small"]}
    assert by_id["T6 mixed>stacked De→En"].single_source == ("Transformer (narrow) [SP] De→En",)
    assert "1 seed (indicative at most)" in by_id["T7 self-training De→En"].cost
    assert "indicative" not in by_id["T3 wide>narrow De→En"].cost  # full trains Table 3 with 3 seeds


# claim id -> the paper's own (system, baseline) cells, read from its Tables 3 and 8
PAPER_CELLS = {"T3 MixRep>narrow SP De→En": (35.25, 34.39), "T3 MixRep>wide SP De→En": (35.25, 34.77),
               "T3 MixRep>wide BPE De→En": (35.51, 34.84), "T3 MixRep>wide SP En→De": (28.88, 28.45),
               "T3 MixRep>wide BPE En→De": (28.96, 28.80), "T3 co-teaching De→En": (36.31, 35.25),
               "T3 co-teaching En→De": (29.71, 28.88), "T8 BPE En→De": (28.98, 28.80),
               "T8 BPE-4k De→En": (35.24, 34.91)}


def test_every_better_claim_takes_its_smallest_effect_from_its_own_paper_cell():
    by_id = {c.id: c for c in mx.declared_claims("full")}
    for id, (system, baseline) in PAPER_CELLS.items():
        c = by_id[id]
        assert (c.paper_delta, c.paper_baseline, c.margin) == (round(system - baseline, 2), baseline, None), id
        m, how = c.smallest_effect(2 * baseline)  # at twice the paper's level, half the paper's delta doubles
        assert m == pytest.approx(system - baseline, abs=0.006) and "at our level" in how, id
    for c in by_id.values():
        if c.kind == "better" and not c.id.startswith("§1"):
            assert c.margin is None and c.paper_delta > 0 and c.paper_baseline, c.id
    # the cells the old margins failed: m is half their own delta, never "0.5" or "1.0"
    assert by_id["T3 MixRep>wide BPE En→De"].smallest_effect(28.80)[0] == pytest.approx(0.08)
    assert by_id["T3 co-teaching En→De"].smallest_effect(28.88)[0] == pytest.approx(0.415)


def test_table8_takes_its_delta_and_its_comparison_against_the_same_wide_baseline():
    for d in mx.DIRECTIONS:
        for c, k in zip((c for c in mx.declared_claims("full") if c.id.startswith("T8") and c.id.endswith(d)), (0, 1)):
            assert c.baseline == mx.system_name(d, mx.WIDE, c.baseline.split("[")[1].split("]")[0])
            assert c.paper_baseline == mx.PAPER_TABLE8["Transformer_512"][d][k]  # the paper's delta is vs T512 too


def test_table2_is_parity_both_ways_within_a_margin_no_paper_cell_fails():
    t2 = [c for c in mx.declared_claims("full") if c.id.startswith("T2")]
    assert len(t2) == 4 and {c.kind for c in t2} == {"parity"}
    for d in mx.DIRECTIONS:
        sp, bpe = (mx.system_name(d, mx.NARROW, column) for column in (SP, BPE))
        assert {(c.system, c.baseline) for c in t2 if c.id.endswith(d)} == {(sp, bpe), (bpe, sp)}
    shares = [abs(b - s) / min(b, s) for row in ("Transformer_512", "Transformer_256")
              for b, s in mx.PAPER_TABLE3[row].values()]
    for c in t2:
        assert c.margin == mx.T2_MARGIN and c.margin_reason and "\n" not in c.margin_reason
        assert max(shares) * 40 < c.margin  # the paper's largest gap, at our level (≤ 40 BLEU), is inside it


SHARED = np.random.default_rng(0).normal(0, 0.3, 200)  # one resampling effect every system shares (paired)


def evidence(name: str, scores: dict[int, float]) -> verdicts.System:
    """A trained system as the chapter builds one: seed-keyed scores with their replicates, one converged run per
    seed."""
    measure = verdicts.Measure(scores, 50, "BLEU|toy", {k: list(v + SHARED) for k, v in scores.items()})
    runs = [verdicts.RunRecord(k, (verdicts.Stage("training", ((100, 30.0), (200, 33.0), (300, 33.1),
                                                               (400, 33.1 + k / 1000)), 400, 10_000, 9_000,
                                                  dev_noise=0.05),)) for k in scores]
    return verdicts.System(name, {"test_2016_flickr": {"BLEU": measure}}, runs)


def judged(claims, systems: dict[str, verdicts.System]) -> dict[str, verdicts.Verdict]:
    """The claims judged against `systems`, the floors at 3 BLEU and every gate passing."""
    floors = {name: verdicts.floor_system(name, "test_2016_flickr", "BLEU", 3.0, 50, "BLEU|toy", list(3.0 + SHARED))
              for c in claims for name in c.floors}
    gates = [verdicts.Gate(name, 1.0, 0.5, "none: a test") for name in {g for c in claims for g in c.gates}]
    return {v.id: v for v in verdicts.judge_all(claims, {**systems, **floors}, gates)}


def test_table2_parity_is_judged_both_ways():
    claims = [c for c in mx.declared_claims("full") if c.id.startswith("T2") and c.id.endswith("De→En")]
    sp, bpe = (mx.system_name("De→En", mx.NARROW, column) for column in (SP, BPE))
    sp_scores = {0: 38.0, 1: 38.2, 2: 38.1}
    near = judged(claims, {sp: evidence(sp, sp_scores), bpe: evidence(bpe, {0: 38.1, 1: 38.1, 2: 38.2})})
    assert {v.verdict for v in near.values()} == {verdicts.REPRODUCED}
    far = judged(claims, {sp: evidence(sp, sp_scores), bpe: evidence(bpe, {0: 36.4, 1: 36.6, 2: 36.5})})
    assert far["T2 BPE on par with SP De→En"].verdict == verdicts.NOT_REPRODUCED
    assert far["T2 SP on par with BPE De→En"].verdict == verdicts.REPRODUCED


def test_one_small_seed_is_indicative_and_a_missing_system_is_not_run_with_its_measured_cost():
    rates = {mx.NARROW: mx.Rate(0.74, 1464, "cpu"), mx.MIXREP: mx.Rate(0.88, 1488, "cpu")}
    by_id = {c.id: c for c in mx.declared_claims("small", rates)}
    claims = [by_id["T3 MixRep>narrow SP De→En"], by_id["T3 wide>narrow De→En"]]
    mixrep, narrow = "MixRep [SP] De→En", "Transformer (narrow) [SP] De→En"
    verdict = judged(claims, {mixrep: evidence(mixrep, {0: 37.3}), narrow: evidence(narrow, {0: 39.2})})
    assert verdict[claims[0].id].verdict == verdicts.INDICATIVE and "leans against" in verdict[claims[0].id].reason
    assert verdict[claims[1].id].verdict == verdicts.NOT_RUN
    assert "Transformer (wide) [SP]: cost not measured" in verdict[claims[1].id].reason


def test_costs_count_every_run_a_claim_needs_at_the_measured_rates():
    rates = {mx.NARROW: mx.Rate(0.74, 1464, "cpu"), mx.MIXREP: mx.Rate(0.88, 1488, "cpu")}
    by_id = {c.id: c for c in mx.declared_claims("small", rates)}
    t2 = by_id["T2 SP on par with BPE De→En"].cost  # narrow SP and narrow BPE: six runs, not three
    assert t2.count("about 0.9 CPU-hours (3 runs × 1,464 updates at 0.74 s each") == 2
    decoders = by_id["T3 decoders De→En"].cost  # both decoders are one run: MixRep's, then its co-teaching stage
    assert "MixRep: about 1.1 CPU-hours" in decoders and "co-teaching stage: cost not measured" in decoders
    assert decoders.count("3 runs") == 1
    assert "on 5,000 pairs: about" in by_id["§1 low-resource De→En"].cost
    assert all("0.41" not in c.cost and "0.94" not in c.cost for c in by_id.values())  # no rate but the measured
    gpu = mx.declared_claims("small", {mx.NARROW: mx.Rate(0.05, 900, "cuda")})[0].cost
    assert "hours on cuda" in gpu and "CPU-hours" not in gpu


def test_a_rate_is_the_median_of_a_systems_runs_on_one_device(tmp_path):
    def run(seconds, updates, device=None):
        out = tmp_path / f"run-{seconds}-{device}"
        out.mkdir()
        if device:  # a run reused from the cache: its entry records where it trained
            (out / "meta.json").write_text(f'{{"device": "{device}"}}')
        return SimpleNamespace(wall_time_s=seconds * updates, updates=updates, out_dir=out, reused=bool(device))

    slowed = [run(1.59, 3968, "cpu"), run(1.21, 2976, "cpu"), run(1.25, 3968, "cpu")]  # one run shared its machine
    rate = mx.measured_rate(slowed, CPU)
    assert (rate.seconds, rate.updates, rate.device, rate.runs) == (pytest.approx(1.25), 3968, "cpu", 3)
    assert "at 1.25 s each, as measured on MixRep [SP], the median of its 3 runs)" in mx.hours_text(3, 3968, rate,
                                                                                                   "MixRep [SP]")
    mixed = mx.measured_rate([run(0.5, 100), run(0.05, 100, "cuda"), run(0.7, 100, "cuda:0")], CPU)
    assert (mixed.seconds, mixed.device, mixed.runs) == (pytest.approx(0.5), "cpu", 1)  # this page's device only
    assert "median" not in mx.hours_text(3, 100, mixed, "MixRep [SP]")


def test_word_segments_group_pieces_by_word():
    pieces = ["▁Ein", "▁Eis", "f", "ischer", "▁", "hütte"]
    assert mx.word_segments(pieces) == [("▁Ein",), ("▁Eis", "f", "ischer"), ("▁", "hütte")]
    assert mx.word_segments(["a", "▁b"]) == [("a",), ("▁b",)]


# ---- the chapter on a toy scale ----------------------------------------------------------------------------

@pytest.fixture
def toy_chapter(offline, tmp_path, monkeypatch):
    toy_scale = replace(mx.MIXREP_SCALES["smoke"], wide=dict(d_model=64), table2_directions=(("en", "de"),),
                        co_teaching=replace(STEPS, max_steps=2), curve_sizes=(40,), run_steps=0,
                        test_examples=None, train_examples=None, valid_sentences=None, table8_vocab=1000)
    monkeypatch.setitem(mx.MIXREP_SCALES, "smoke", toy_scale)
    monkeypatch.setitem(BASELINE_SCALES, "smoke", TOY)
    return mx.run_chapter("smoke", CPU, tmp_path / "ch02", 0)


def check_runs(ch):
    """Every system of every table trained, MixRep's two decoders from one run, Table 8 beside the wide model."""
    trained = {(d, system, column) for d, system, column, _ in ch.runs}
    for system in (mx.NARROW, mx.WIDE, mx.MIXREP, mx.COTEACH, mx.STACKED, mx.SELF_TRAIN, mx.QUERY_OWNED):
        assert ("De→En", system, SP) in trained and ("De→En", system, BPE) in trained, system
    assert ("En→De", mx.NARROW, BPE) in trained and ("De→En", mx.table8_system(ch.scale), "BPE-1k") in trained
    assert ("De→En", mx.WIDE, "BPE-1k") in trained and ("De→En", mx.NARROW, "BPE-1k") not in trained
    assert ch.runs["De→En", mx.MIXREP, SP, 0].run is ch.runs["De→En", mx.MIXREP, BPE, 0].run  # two decoders
    assert ch.runs["De→En", mx.QUERY_OWNED, SP, 0].run.model.cfg.mix_attention_owner == "queries"
    assert ch.runs["De→En", mx.STACKED, SP, 0].run.model.cfg.mixing == "stacked"
    assert len(ch.co_teaching["De→En", 0]) == 2 * len(ch.primary.data["mix"].encoded["train"])
    assert ch.runs["De→En", mx.NARROW, SP, 0].run.reused is False  # no chapter 0 run in this cache


def check_evidence(ch, systems):
    """Measures keyed by seed id with their replicates, floors declared as floors, every stage of every run."""
    refs = mx.references(ch, "De→En")
    mixrep = systems["MixRep [SP] De→En"]
    measure = mixrep.measure(ch.scale.test_split, mx.METRIC)
    assert set(measure.scores) == set(measure.replicates) == set(ch.seeds) and measure.sentences == len(refs)
    assert measure.scores[0] == pytest.approx(mx.seed_bleu(ch, "De→En", mx.MIXREP, SP, 0))
    for floor in mx.FLOORS:
        f = systems[mx.floor_name(floor, "De→En")]
        assert f.floor and f.runs == () and f.updates is None
        fm = f.measure(ch.scale.test_split, mx.METRIC)
        assert (fm.sentences, fm.signature) == (measure.sentences, measure.signature)  # scored like the systems
    co = systems["MixRep + co-teaching [SP] De→En"].run(0)
    assert [s.name for s in co.stages] == [mx.TRAINING, mx.CO_TEACHING]
    assert co.stages[0] == mixrep.run(0).stages[0]  # MixRep's own training, then the co-teaching stage
    assert (co.stages[0].schedule, co.stages[1].schedule) == (verdicts.schedule_of(ch.recipe.train),
                                                              verdicts.schedule_of(ch.scale.co_teaching))
    assert co.updates == co.stages[0].updates + co.stages[1].updates and co.target_tokens is not None
    self_trained = systems["Transformer (wide) + self-training [BPE] De→En"].run(0)
    assert [s.name for s in self_trained.stages] == [mx.TRAINING, mx.SELF_TRAINING]
    assert self_trained.stages[0] == systems["Transformer (wide) [BPE] De→En"].run(0).stages[0]
    curve = systems["MixRep, first 40 pairs [SP] De→En"]
    assert [s.name for s in curve.run(0).stages] == [mx.TRAINING]  # a learning-curve system has its run too
    gain = systems[mx.curve_gain_name("fewest pairs", "De→En")]
    assert [s.name for s in gain.run(0).stages] == ["MixRep, first 40 pairs: training",
                                                    "Transformer (narrow), first 40 pairs: training"]
    narrow = systems["Transformer (narrow), first 40 pairs [SP] De→En"]
    assert gain.values(ch.scale.test_split, mx.METRIC)[0] == pytest.approx(
        curve.values(ch.scale.test_split, mx.METRIC)[0] - narrow.values(ch.scale.test_split, mx.METRIC)[0])
    rows = {r["system"]: r for r in mx.evidence_table(systems, ch.scale.test_split)}
    assert rows["MixRep + co-teaching [SP] De→En"]["stages"] == "training → co-teaching"
    assert rows["copy input De→En"]["floor"] == "yes"


def check_gates(ch, gates):
    """Every gate prints the paper's figure; the quality, wide and baseline gates measure what they say."""
    by_name = {g.name: g for g in gates}
    assert all(g.paper.strip() for g in gates)
    narrow = statistics.fmean(mx.bleu(ch, "De→En", mx.NARROW, SP))
    quality = by_name[mx.quality_gate_name("De→En", mx.MIXREP, BPE)]
    assert quality.value == pytest.approx(mx.ratio(min(mx.bleu(ch, "De→En", mx.MIXREP, BPE)), narrow))
    assert quality.target == mx.QUALITY_RATIO <= quality.paper_value == round(mx.paper_quality_floor()[0], 3)
    wide = by_name[mx.wide_gate_name("De→En", SP)]
    assert wide.paper_value == round(34.77 / 34.39, 3) and "34.77 / 34.39" in wide.paper
    assert by_name[mx.baseline_gate_name("En→De")].paper_value == round(28.24 / 34.39, 3)
    curve = by_name[mx.quality_gate_name("De→En", "MixRep, first 40 pairs", SP)]
    assert curve.paper_value is None and curve.paper.startswith("none")  # its yardstick: the narrow model on 40 pairs
    assert mx.quality_gate_name("De→En", mx.NARROW, SP) not in by_name  # chapter 0's model has the baseline gate
    assert by_name[mx.key_gate_name("De→En")].passed  # this scale's narrow SP baseline is chapter 0's toy run
    assert not by_name[mx.baseline_gate_name("De→En")].passed  # and it is no sane baseline


def test_the_whole_chapter_runs_judges_every_claim_and_analyses_on_a_toy_scale(toy_chapter, tmp_path):
    ch = toy_chapter
    check_runs(ch)
    rates = mx.measured_rates(ch)
    assert set(rates) == {mx.NARROW, mx.WIDE, mx.MIXREP} and rates[mx.MIXREP].device == "cpu"
    runs = [ch.runs["De→En", mx.MIXREP, SP, s].run for s in ch.seeds]
    assert rates[mx.MIXREP].seconds == pytest.approx(statistics.median(r.wall_time_s / r.updates for r in runs))
    assert rates[mx.MIXREP].runs == len(ch.seeds)
    # every claim the toy scale runs finds its systems, floors and gates; a toy model passes no baseline gate
    claims = mx.declared_claims("smoke", rates)
    assert [replace(c, cost="") for c in claims] == [replace(c, cost="") for c in mx.declared_claims("smoke")]
    systems, gates = mx.chapter_systems(ch), mx.chapter_gates(ch, claims)
    check_evidence(ch, systems)
    check_gates(ch, gates)
    ran = [c for c in claims if {c.system, c.baseline} <= set(systems)]
    assert {c.id for c in ran} == {c.id for c in claims if "De→En" in c.id} | {"T2 SP on par with BPE En→De",
                                                                               "T2 BPE on par with SP En→De"}
    for c in ran:
        assert set(c.systems()) <= set(systems) and set(c.gates) <= {g.name for g in gates}, c.id
    judged = {v.id: v for v in verdicts.judge_all(claims, systems, gates)}
    assert all(judged[c.id].verdict == verdicts.NOT_DECIDED and judged[c.id].reason.startswith("gate failed")
               for c in ran)
    assert {v.verdict for i, v in judged.items() if i not in {c.id for c in ran}} == {verdicts.NOT_RUN}
    path = verdicts.write_results(tmp_path / "ch02.json", "2", "smoke", "abc", list(judged.values()), systems,
                                  identity=chapters.identity("ch02_mixrep", "smoke"))
    stored = verdicts.load_json(path)
    assert stored["recipe"] == chapters.recipe_fingerprint("ch02_mixrep", "smoke")
    assert [(v.id, v.verdict, v.reason) for v in verdicts.rejudge(stored)] == \
        [(v.id, v.verdict, v.reason) for v in judged.values()]  # the file holds the whole evidence
    table = mx.results_table(ch, {mx.NARROW: "Transformer_256", mx.COTEACH: "+ co-teaching"}, mx.PAPER_TABLE3,
                             ["De→En"])
    assert table[0]["De→En SP, paper"] == 34.39 and table[1]["De→En BPE, paper"] == 36.41
    assert len(mx.outputs(ch, "De→En", mx.MIXREP, BPE)) == len(mx.references(ch, "De→En")) == 6
    # the analyses
    rows = mx.tokenization_table(ch.primary)
    val = ch.primary.data["mix"].corpora["val"]
    assert [r["language"] for r in rows] == [*val.source_langs, val.target_lang]
    assert all(0 <= r["words segmented differently (%)"] <= 100 for r in rows)
    model = ch.runs["De→En", mx.MIXREP, SP, 0].run.model
    i = mx.heatmap_index(ch.primary, "test_2016_flickr")
    queries, keys, weights = mx.mix_attention_map(model, ch.primary.data["mix"], "test_2016_flickr", i)
    assert weights.shape == (len(queries), len(keys))
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(queries)))
    refs = mx.references(ch, "De→En")
    outputs = {"a": mx.outputs(ch, "De→En", mx.NARROW, SP), "b": mx.outputs(ch, "De→En", mx.MIXREP, SP)}
    cases = mx.case_studies(refs, refs, outputs, "a", "b")
    assert [c["case"] for c in cases] == ["largest gain", "largest loss"]


def test_the_scale_s_mixrep_overrides_reach_every_mixrep_run_and_no_transformer(monkeypatch, tmp_path):
    configs = {}

    def fake_train_model(model, data, cfg, device, out_dir, **kw):
        configs[type(model).__name__] = cfg
        return SimpleNamespace(model=model)
    monkeypatch.setattr(mx, "train_model", fake_train_model)
    pair = SimpleNamespace(bpe=SimpleNamespace(vocab_size=50), sp=SimpleNamespace(vocab_size=50))
    data = SimpleNamespace(tokenizer=pair)
    mx.train_mixrep(data, BASELINE_SCALES["small"], CPU, tmp_path, 0,
                    train_overrides=mx.MIXREP_SCALES["small"].mixrep_train)
    mx.train_transformer(SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=50, pad_id=0)),
                         BASELINE_SCALES["small"], CPU, tmp_path, 0)
    assert configs["MixRepTransformer"].sdpa_backends == ("math",)
    assert configs["Transformer"] == replace(BASELINE_SCALES["small"].train, seed=0, progress=False)  # chapter 0's
