"""Coverage-NAT recipes (msgcore/experiments/coverage_nat.py) on the toy corpus and hand-made outputs."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from msgcore import verdicts
from msgcore.verdicts import RunRecord
from msgcore.batching import collate, encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.experiments import RunResult, Scale, TranslationData
from msgcore.experiments import coverage_nat as nat
from msgcore.experiments.coverage_nat import (NATScale, bleu_by_length, bleu_with_and_without_dedup, distill,
                                              latency, repeats_by_half, train_nat, translate_lpd, translate_nat)
from msgcore.generation import GenerationConfig
from msgcore.model import Transformer, preset
from msgcore.models.coverage_nat import CoverageNAT, generate_nat
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import TrainConfig, translate_encoded
from msgcore.utils import MsgcoreError

CPU = torch.device("cpu")
STEPS = TrainConfig(lr=3e-3, warmup_steps=2, max_tokens=500, max_epochs=1, patience=0, log_every=1, progress=False)
SCALE = NATScale("tiny", dict(d_model=32, d_ff=64, dropout=0.0, max_length_offset=16), STEPS,
                 TrainConfig(**{**vars(STEPS), "lr": 1e-4, "schedule": "constant"}),
                 ablation=TrainConfig(**{**vars(STEPS), "max_steps": 2, "lr": 1e-4, "schedule": "constant"}),
                 coverage_iterations=2, beta=0.5, ablation_k=(1,), ablation_beta=(1.0,), teacher_beam=2,
                 test_beam=2, lpd_candidates=3, curve_every=0, seeds=2)
TEACHER = Scale("tiny", dict(d_model=32, d_ff=64, dropout=0.0), TrainConfig(**{**vars(STEPS), "max_epochs": 4}), beam_size=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    corpora = {s: synthetic_corpus(40 if s == "train" else 10, num_sources=1, seed=0, split=s) for s in ("train", "val")}
    tok = Tokenizer.train(corpora["train"].texts(), vocab_size=60, cache_dir=tmp_path_factory.mktemp("tok"))
    return TranslationData(tok, corpora, {s: encode_corpus(c, tok) for s, c in corpora.items()})


def teacher(data):
    torch.manual_seed(0)
    return Transformer(preset("tiny", vocab_size=data.tokenizer.vocab_size, d_model=32, d_ff=64, dropout=0.0)).eval()


def test_distilled_targets_are_the_teachers_translations_and_are_cached(data, monkeypatch):
    model = teacher(data)
    kd = distill(model, data, SCALE, CPU, split="val")
    hyps = translate_encoded(model, data.tokenizer, data.encoded["val"], CPU, GenerationConfig(beam_size=2))
    assert kd.sources == data.encoded["val"].sources
    assert kd.target == [data.tokenizer.encode(h) or [data.tokenizer.unk_id] for h in hyps]
    monkeypatch.setattr(nat, "translate_encoded", lambda *a, **k: pytest.fail("distilled again"))
    assert distill(model, data, SCALE, CPU, split="val").target == kd.target  # from the run cache
    assert nat.distilled_bleu(kd, data, "val") == pytest.approx(
        bleu_with_and_without_dedup(kd.target, data, "val")["BLEU"])


def test_two_phases_add_sca_at_a_constant_learning_rate(data, tmp_path):
    phase1, phase2 = train_nat(data, SCALE, CPU, tmp_path / "nat")
    assert phase1.model.cfg.coverage_weight == 0 and phase2.model.cfg.coverage_weight == 0.5
    lrs = {row["lr"] for row in phase2.run.history if row["kind"] == "train"}
    assert lrs == {1e-4}


def test_nat_base_gets_the_same_phase_2_as_coverage_nat_without_sca(data, tmp_path):
    """Equal budgets: NAT-Base continues through phase 2 on the same schedule, with no SCA term to weigh."""
    base1, base2 = train_nat(data, SCALE, CPU, tmp_path / "base", use_coverage=False)
    cov1, cov2 = train_nat(data, SCALE, CPU, tmp_path / "cov")
    assert base2.model.cfg.coverage_weight == 0 and not base2.model.cfg.use_coverage
    steps = lambda run: [row["step"] for row in run.run.history if row["kind"] == "train"]
    lrs = lambda run: [row["lr"] for row in run.run.history if row["kind"] == "train"]
    assert steps(base2) == steps(cov2) and lrs(base2) == lrs(cov2)  # the same updates at the same rates
    assert steps(base1) == steps(cov1)
    assert any(not torch.equal(p, q) for p, q in zip(base1.model.state_dict().values(),
                                                      base2.model.state_dict().values()))  # phase 2 trained it


def test_the_curve_is_one_run_cut_into_chunks_and_is_cached(data, tmp_path):
    cfg = TrainConfig(**{**vars(STEPS), "max_epochs": 100, "max_steps": 6, "validate_every": 3})
    torch.manual_seed(0)
    plain = nat.train_model(CoverageNAT(nat.nat_config(data, SCALE)), data, cfg, CPU, tmp_path / "plain")
    torch.manual_seed(0)
    cut = nat.train_with_curve(CoverageNAT(nat.nat_config(data, SCALE)), data, cfg, CPU, tmp_path / "cut", every=3)
    assert [p["step"] for p in cut.curve] == [3, 6]
    assert set(cut.curve[0]) == {"step", "BLEU", "BLEU (dedup)", "repeats %"}
    losses = lambda h: [round(r["loss"], 5) for r in h if r["kind"] == "train"]
    # the same updates as one uncut run (the cache keeps the history up to the best checkpoint, where both end)
    assert losses(cut.run.history) == losses(plain.history)[:len(losses(cut.run.history))]
    for a, b in zip(cut.model.state_dict().values(), plain.model.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert not cut.run.reused
    torch.manual_seed(0)
    again = nat.train_with_curve(CoverageNAT(nat.nat_config(data, SCALE)), data, cfg, CPU, tmp_path / "again", every=3)
    assert again.run.reused and again.curve == cut.curve


def test_a_curve_run_that_stops_early_at_a_chunks_end_records_its_last_point_once(data, tmp_path):
    cfg = TrainConfig(**{**vars(STEPS), "lr": 0.0, "max_epochs": 100, "max_steps": 30, "validate_every": 3,
                         "patience": 1})  # nothing learnt: the second validation is no better, and stops the run
    torch.manual_seed(0)
    run = nat.train_with_curve(CoverageNAT(nat.nat_config(data, SCALE)), data, cfg, CPU, tmp_path / "a", every=3)
    assert [p["step"] for p in run.curve] == [3, 6] and max(r["step"] for r in run.run.history) == 6
    stored = [{"step": 3, "BLEU": 1.0}, {"step": 6, "BLEU": 2.0}, {"step": 6, "BLEU": 2.0}]  # from before the fix
    assert nat.one_point_per_step(stored) == stored[:2]


def test_an_interrupted_curve_run_resumes_to_the_same_result(data, tmp_path, monkeypatch):
    from msgcore.trainer import Trainer

    cfg = TrainConfig(**{**vars(STEPS), "max_epochs": 100, "max_steps": 9, "validate_every": 3})
    torch.manual_seed(0)
    straight = nat.train_with_curve(CoverageNAT(nat.nat_config(data, SCALE)), data, cfg, CPU, tmp_path / "a", every=3)
    monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path / "other-cache"))
    calls, real_step = {"n": 0}, Trainer.train_step

    def dying_step(self, batches, *rest):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # a kill in the second chunk, after the first chunk's point
        return real_step(self, batches, *rest)
    monkeypatch.setattr(Trainer, "train_step", dying_step)
    torch.manual_seed(0)
    with pytest.raises(KeyboardInterrupt):
        nat.train_with_curve(CoverageNAT(nat.nat_config(data, SCALE)), data, cfg, CPU, tmp_path / "b", every=3)
    steps_after = []
    monkeypatch.setattr(Trainer, "train_step", lambda self, b, *rest: steps_after.append(1) or real_step(self, b, *rest))
    torch.manual_seed(0)
    resumed = nat.train_with_curve(CoverageNAT(nat.nat_config(data, SCALE)), data, cfg, CPU, tmp_path / "c", every=3)
    assert len(steps_after) == 6  # it went on from the first chunk's last.pt (update 3), not from the start
    assert not resumed.run.reused and resumed.curve == straight.curve
    assert [r["step"] for r in resumed.run.history] == [r["step"] for r in straight.run.history]
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    entries = list((tmp_path / "other-cache").iterdir())
    assert entries and not any((e / "work").exists() for e in entries)  # the resumable state goes once finished
    curve_entry = next(e for e in entries if e.name.startswith("natcurve-"))
    meta = json.loads((curve_entry / "meta.json").read_text())
    assert meta["wall_time_s"] == resumed.run.wall_time_s  # both processes' time, not the resuming one's alone
    assert json.loads((curve_entry / "log.json").read_text()) == resumed.run.history  # its log, as a run's entry


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
    for mode in ("unk", "uniform_copy"):
        assert -1.0 <= nat.decoder_input_similarity(model, data, "val", CPU, mode) <= 1.0
    assert model.cfg.decoder_input == "uniform_copy"  # restored


def test_latency_times_every_sentence_after_warmup_and_the_table_reports_the_mean():
    calls, delays = [], [0.0, 0.0, 0.02, 0.0, 0.0]

    def translate_one(i):
        calls.append(i)
        if len(calls) > 2:  # the two warm-up calls are not timed
            import time
            time.sleep(delays[i])

    times = latency(translate_one, 5, CPU, warmup=2)
    assert calls == [0, 1, 0, 1, 2, 3, 4] and len(times) == 5 and times[2] >= 0.02
    row = {"BLEU": 20.0, "BLEU (dedup)": 21.0, "repeats %": 3.0}
    table = nat.Table2(scores={nat.AT: [row], nat.COV: [row]},
                       latency={nat.AT: [0.010, 0.010, 0.040], nat.COV: [0.002, 0.002, 0.002]},
                       batch64={nat.AT: 2.0, nat.COV: 0.5})
    assert table.speedup(nat.COV) == pytest.approx(10.0)  # the mean, 20 ms, over 2 ms: not the median's 5×
    row = table.frame().loc[nat.AT]
    assert row["latency, mean (ms)"] == "20.0" and row["latency, median (ms)"] == "10.0"
    assert table.frame().loc[nat.COV, "speed-up at batch 64"] == "4.0×"
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


def test_a_direction_uses_the_chapter0_run_as_teacher_and_distils_with_it(data, tmp_path):
    from msgcore.experiments import train_translation
    from msgcore.experiments.coverage_nat import train_direction

    chapter0 = train_translation(data, TEACHER, CPU, tmp_path / "chapter0")  # chapter 0 ran first
    direction = train_direction(data, SCALE, TEACHER, CPU, tmp_path, split="val")
    assert direction.teacher_run.reused  # the same run, from the cache
    for a, b in zip(direction.teacher.state_dict().values(), chapter0.model.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert direction.name == "Xa→Xt" and direction.key == "xa-xt"
    hyps = translate_encoded(direction.teacher, data.tokenizer, data.encoded["val"], CPU,
                             GenerationConfig(beam_size=SCALE.test_beam))
    assert direction.teacher_hyps == hyps
    assert direction.distilled.target == distill(direction.teacher, data, SCALE, CPU).target


def test_table2_scores_every_seed_and_times_every_system(data, tmp_path):
    from msgcore.experiments.coverage_nat import AT, lpd_name, table2, train_direction, train_main_systems

    direction = train_direction(data, SCALE, TEACHER, CPU, tmp_path, split="val")
    runs = train_main_systems(direction, SCALE, CPU, tmp_path, seeds=(0, 1))
    names = (nat.BASE_P1, nat.BASE, nat.COV_P1, nat.COV, nat.NO_SCA)
    assert set(runs) == {(name, s) for name in names for s in (0, 1)}
    assert runs["Coverage-NAT", 1].model.cfg.coverage_weight == SCALE.beta
    assert runs[nat.NO_SCA, 1].model.cfg.coverage_weight == 0 and runs[nat.NO_SCA, 1].model.cfg.use_coverage
    table = table2(direction, runs, SCALE, CPU, seeds=(0, 1), n_latency=3)
    systems = [AT, "NAT-Base", "Coverage-NAT", lpd_name(SCALE)]
    assert list(table.scores) == systems and set(table.latency) == set(systems)
    assert all(len(table.latency[name]) == 3 for name in systems) and set(table.batch64) == {AT, nat.BASE, nat.COV}
    assert [len(table.scores[name]) for name in systems] == [1, 2, 2, 1]
    assert table.outputs["Coverage-NAT", 1] == translate_nat(runs["Coverage-NAT", 1].model, data, "val", CPU)
    frame = table.frame()
    assert frame.loc[AT, "speed-up"] == "1.0×" and frame.loc["NAT-Base", "runs"] == 2
    assert "±" in frame.loc["NAT-Base", "BLEU"] and "±" not in frame.loc[AT, "BLEU"]
    ablations = nat.train_ablations(direction, runs, SCALE, CPU, tmp_path / "ablation", seed=0)
    assert set(ablations) == {"K = 2, β = 1", "K_train = 1"}
    assert ablations["K_train = 1"].model.cfg.coverage_iterations == 1
    assert ablations["K_train = 1"].model.cfg.coverage_weight == 0
    assert sum(r["kind"] == "train" for r in ablations["K_train = 1"].run.history) == 2  # the ablation recipe
    gates = nat.direction_gates(direction, SCALE, {k: v for k, v in table.scores.items() if k in ("NAT-Base",)})
    assert [g.name.split(": ", 1)[1][:8] for g in gates] == ["AT teach", "the dist"] + ["NAT-Base"] * 3
    assert all(g.paper for g in gates)  # every gate says the paper's own figure, or why it has none
    ratio = gates[-1]
    assert ratio.name.endswith("÷ the teacher's BLEU (test, worst seed)") and ratio.target == 0.68
    assert ratio.paper_value == pytest.approx(18.60 / 27.19, abs=5e-4) and "0.684 × its teacher" in ratio.paper
    held_out = nat.distilled_bleu(nat.distill(direction.teacher, direction.data, SCALE, CPU, "val"), direction.data, "val")
    assert gates[1].value == pytest.approx(held_out - direction.teacher_scores["BLEU"].score)  # dev, not train


def test_paper_tables_are_the_papers_numbers():
    assert nat.PAPER_TABLE2["Coverage-NAT"]["WMT14 En→De"] - nat.PAPER_TABLE2["NAT-Base"]["WMT14 En→De"] == \
        pytest.approx(2.75)  # "+2.75 ... on WMT14 En→De" (§V-A)
    assert nat.PAPER_TABLE3["K = 5, β = 0.5"]["BLEU"] - nat.PAPER_TABLE3["NAT-Base"]["BLEU"] == pytest.approx(1.20)
    base, cov = nat.PAPER_TABLE4["NAT-Base"], nat.PAPER_TABLE4["Coverage-NAT"]
    assert [round(base[k] - cov[k], 2) for k in ("short", "long", "all")] == [2.16, 4.53, 3.87]  # Table IV's deltas


def test_scales_take_chapter0s_teacher_and_fit_their_budgets():
    from msgcore.experiments import BASELINE_SCALES

    for name in ("smoke", "small", "full"):
        assert nat.teacher_scale(name) is BASELINE_SCALES[name]
    small, full = nat.NAT_SCALES["small"], nat.NAT_SCALES["full"]
    assert small.seeds == 3 and small.directions == (("de", "en"),) and small.phase1.patience > 0
    assert small.preset == nat.teacher_scale("small").preset  # the AT row of the speed claim has the NATs' size
    assert small.ablation is small.phase2 and small.phase2.max_steps < small.phase1.max_steps
    assert small.phase2.lr < small.phase1.lr and small.phase2.schedule == "constant"
    assert small.teacher_beam == 5 and small.distill_examples == 0 and small.latency_sentences == 0
    for scale in (small, full):  # the same gates at both scales
        assert (scale.max_repeats, scale.min_nat_bleu, scale.min_teacher_ratio) == (15.0, 10.0, 0.68)
        assert scale.phase1.valid_max_sentences == 0 == scale.phase2.valid_max_sentences  # the whole dev set
    assert full.seeds == 3 and len(full.directions) == 2 and full.ablation is full.phase2
    assert (full.phase2.max_steps, full.phase2.lr, full.phase2.schedule) == (1000, 1e-5, "constant")  # the paper's
    phase1_runs = len(full.directions) * (2 * full.seeds + full.raw_data_baseline)
    assert phase1_runs == 14 and phase1_runs * full.phase1.max_steps <= 140_000  # one T4 session's worth of updates
    assert small.phase1.label_smoothing == 0.1


# ---- the claims and the protocol's evidence ---------------------------------------------------------------

def nat_run(valid: list[tuple[int, float]], last: int, noise: float = 0.1) -> nat.NATRun:
    """A NAT run as the run cache stores it: its whole log, every validation with its noise and budget."""
    history = [{"kind": "valid", "step": step, "valid_bleu": bleu, "valid_noise": noise, "source_tokens": 10 * step,
                "target_tokens": 9 * step} for step, bleu in valid]
    history.append({"kind": "train", "step": last, "source_tokens": 10 * last, "target_tokens": 9 * last})
    return nat.NATRun(RunResult(None, history, 1.0, Path(".")), [{"step": step} for step, _ in valid])


def test_phase_1_is_judged_by_its_plateau_and_phase_2_by_its_fixed_length():
    scale = replace(nat.NAT_SCALES["small"], phase1=TrainConfig(max_steps=1000, patience=3))
    rising = nat.phase1_stage(nat_run([(200, 5.0), (400, 9.0), (600, 12.0), (800, 14.0), (1000, 15.0)], 1000), scale)
    assert rising.updates == 1000 and not rising.early_stopped and not rising.converged()[0]
    stopped = nat.phase1_stage(nat_run([(200, 20.0), (400, 29.0), (600, 28.0), (800, 28.5), (1000, 28.9)], 1000), scale)
    assert stopped.early_stopped and stopped.converged() == (True, "")
    assert (stopped.source_tokens, stopped.target_tokens) == (10_000, 9_000)
    phase2_cfg = TrainConfig(max_steps=300, lr=5e-5, schedule="constant")
    phase2 = nat.fixed_stage("phase 2", nat_run([(100, 15.0), (200, 15.9), (300, 16.1)], 300), phase2_cfg)
    assert phase2.fixed_length == 300 and phase2.converged() == (True, "")  # its learning-rate drop is not a trend
    assert RunRecord(0, (rising, phase2)).converged()[0] is False  # phase 1 is still judged
    assert RunRecord(0, (stopped, phase2)).converged() == (True, "")


def test_declared_claims_are_the_same_at_every_throughput_but_for_the_cost_of_what_is_not_run():
    for name in nat.NAT_SCALES:
        plain, costed = nat.declared_claims(name), nat.declared_claims(name, seconds_per_update=0.5)
        assert [replace(c, cost="") for c in plain] == [replace(c, cost="") for c in costed]
        assert len({c.id for c in plain}) == len(plain) == 13
    small = {c.id: c for c in nat.declared_claims("small", seconds_per_update=0.5)}
    assert "CPU-hours" in small["T2-en-de"].cost and not small["T2-de-en"].cost
    assert (small["T2-de-en"].paper_delta, small["T2-de-en"].paper_baseline) == (2.34, 22.70)  # m at our level
    assert (small["T4-SCA"].paper_delta, small["T4-SCA"].paper_baseline) == (0.85, 1.51)
    smoke = {c.id: c for c in nat.declared_claims("smoke")}
    assert smoke["T3-K"].cost and not {c.id: c for c in nat.declared_claims("full")}["T2-en-de"].cost
    with pytest.raises(MsgcoreError, match="unknown scale"):
        nat.declared_claims("huge")


def test_halves_are_measured_on_the_whole_sets_draws_so_they_pair():
    outputs = {0: [[1, 1, 2], [3, 4], [5, 5, 5, 6], [7]], 1: [[1, 2, 2], [3, 3], [5, 6], [7, 7]]}
    keep = [True, False, True, False]
    short = nat.repeats_measure(outputs, keep)
    assert short.sentences == 4 and short.scores[0] == pytest.approx(100 * 3 / 7)  # (1 + 2) of 3 + 4 tokens
    assert nat.repeats_measure(outputs).scores[1] == pytest.approx(100 * 3 / 9)
    long = nat.repeats_measure(outputs, [not k for k in keep])
    assert short.signature == long.signature and len(short.replicates[0]) == len(long.replicates[0])


@pytest.fixture(scope="module")
def de_en(tmp_path_factory):
    """The toy corpus named like Multi30k De→En, with a test split named like Multi30k's."""
    splits = {"train": "train", "val": "val", "test_2016_flickr": "test"}
    corpora = {name: replace(synthetic_corpus(40 if split == "train" else 10, num_sources=1, seed=0, split=split),
                             split=name, source_langs=("de",), target_lang="en") for name, split in splits.items()}
    tok = Tokenizer.train(corpora["train"].texts(), vocab_size=60, cache_dir=tmp_path_factory.mktemp("tok"))
    return TranslationData(tok, corpora, {s: encode_corpus(c, tok) for s, c in corpora.items()})


def test_every_declared_claim_names_systems_floors_and_gates_the_chapter_produces(de_en, tmp_path):
    scale = replace(SCALE, coverage_iterations=5, ablation_k=(1, 10), ablation_beta=(1.0,))  # the scales' K and rows
    seeds = (0, 1)
    direction = nat.train_direction(de_en, scale, TEACHER, CPU, tmp_path)
    runs = nat.train_main_systems(direction, scale, CPU, tmp_path, seeds)
    ablations = nat.train_ablations(direction, runs, scale, CPU, tmp_path / "ablation", seeds[0])
    chapter = nat.ChapterRuns(scale, seeds, {direction.name: direction}, {direction.name: runs}, ablations, None, {})
    table = nat.table2(direction, {k: v.run for k, v in runs.items()}, scale, CPU, seeds, n_latency=2)
    evidence = nat.Evidence(nat.dev_outputs(chapter, CPU), nat.table3(chapter, CPU, 2),
                            {s: nat.kdec_outputs(runs[nat.NO_SCA, s].model, de_en, CPU, ks=(3, 5)) for s in seeds},
                            nat.speedups(table, runs, direction, CPU, seeds, 2),
                            nat.lpd_outputs(table, runs, direction, scale, CPU, seeds))
    systems = nat.chapter_systems(chapter, {direction.name: table}, evidence, nat.floor_systems(direction))
    base, cov, no_sca = (systems[nat.nat_name(n, "De→En")] for n in (nat.BASE, nat.COV, nat.NO_SCA))
    assert base.updates == cov.updates == no_sca.updates  # every system had the same phase 2
    assert [r.seed for r in cov.runs] == [0, 1] and [s.name for s in cov.runs[0].stages] == ["phase 1", "phase 2"]
    assert cov.runs[0].stages[1].fixed_length == scale.phase2.max_steps
    assert no_sca.runs[0].stages[0] == cov.runs[0].stages[0]  # the control continues Coverage-NAT's phase 1
    assert sorted(no_sca.measure(nat.DEV, nat.BLEU_DEDUP).scores) == [0, 1]  # SCA's control on every seed
    assert no_sca.measure(nat.DEV, nat.BLEU_DEDUP).sentences == 10  # the whole (toy) dev set, with replicates
    assert systems[nat.copy_floor("De→En")].floor and systems["K_train = 1"].updates == cov.updates
    assert "K = 5, β = 0" not in systems
    sca = systems[nat.reduction_name("SCA", "De→En")]
    assert {s.name.split(",")[0] for s in sca.runs[0].stages} == {nat.NO_SCA, nat.COV}  # rests on both systems' runs
    scores = {k: v for k, v in table.scores.items() if k in (nat.BASE, nat.COV)}
    for name, nat_scale in nat.NAT_SCALES.items():
        claims = nat.declared_claims(name)
        gates = nat.direction_gates(direction, nat_scale, scores)
        assert {g.name for g in gates} == set(nat.gate_names("De→En", nat_scale))
        missing = {c.id for c in claims if not set(c.systems()) <= set(systems)}
        assert missing == {"T2-en-de"}  # the toy chapter, like smoke and small, has no En→De
        judged = {v.id: v for v in verdicts.judge_all(claims, systems, gates)}
        assert judged["T2-en-de"].verdict == verdicts.NOT_RUN
        passing = [verdicts.Gate(g.name, 1.0, 0.0, "none") for g in gates]
        for v in verdicts.judge_all(claims, systems, passing):
            assert v.verdict in (verdicts.NOT_RUN, verdicts.NOT_DECIDED, verdicts.INDICATIVE), v
