"""Chapter 4's recipes (msgcore.experiments.postech_ape): the eSCAPE filter, the synthetic MT, MT-quality
buckets, the do-nothing baseline, the ensemble rules, initialisation from a pre-trained model, option errors."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from msgcore import verdicts as V
from msgcore.data import Corpus
from msgcore.experiments import postech_ape as P
from msgcore.metrics import corpus_score
from msgcore.model import TransformerConfig
from msgcore.models.postech_ape import PostechConfig, from_pretrained
from msgcore.models.trice import TriceConfig, TriceTransformer
from msgcore.utils import MsgcoreError


def triplets(rows):
    return Corpus("t", "train", ("en", "de"), "de", [[r[0] for r in rows], [r[1] for r in rows]], [r[2] for r in rows])


def test_filter_keeps_and_drops_the_right_triplets():
    pe = "das ist ein kleiner test satz hier"
    corpus = triplets([
        ("this is a small test sentence", pe, pe),  # perfect MT: kept
        ("this is a small test sentence", "das ist ein grosser test satz hier", pe),  # TER 1/7: kept
        ("this is a small test sentence", "a b c d e f g", pe),  # TER 100 > 75: dropped
        ("this is a small test sentence", "das ist", pe),  # length ratio 7/2 >= 1.4: dropped
        (" ".join(["w"] * 71), pe, pe),  # src longer than 70 words: dropped
    ])
    kept = P.escape_filter(corpus)
    assert kept.sources[1] == [pe, "das ist ein grosser test satz hier"]


def test_filter_boundaries():
    rule = P.FilterRule()
    five, seven = "a b c d e", "a b c d e f g"
    assert rule.keeps("x", five, five, 75.0)  # TER exactly 75 is kept (<= 75)
    assert not rule.keeps("x", five, five, 75.01)
    assert not rule.keeps("x", five, seven, 0.0)  # ratio 7/5 = 1.4 is not < 1.4
    assert rule.keeps("x", "a b c d e f g h i j", "a b c d e f g h i j k l m", 0.0)  # 1.3 < 1.4


def test_synthetic_mt_is_deterministic_and_keeps_src_and_pe():
    parallel = Corpus("p", "train", ("en",), "de", [["one two three", "four five six seven"]],
                      ["eins zwei drei", "vier fünf sechs sieben"])
    a, b = P.synthetic_mt(parallel, 0, 1.5), P.synthetic_mt(parallel, 0, 1.5)
    assert a.sources == b.sources and a.target == parallel.target and a.sources[0] == parallel.sources[0]
    assert P.synthetic_mt(parallel, 0, 0.0).sources[1] == parallel.target  # rate 0: a perfect copy
    assert len(P.synthetic_mt(parallel, 0, 1.0, limit=1)) == 1


def test_bucket_assignment():
    assert P.bucket_of(0.0) == "TER = 0 (perfect MT)"
    assert P.bucket_of(0.5) == P.bucket_of(20.0) == "0 < TER ≤ 20"
    assert P.bucket_of(20.01) == P.bucket_of(40.0) == "20 < TER ≤ 40"
    assert P.bucket_of(40.5) == P.bucket_of(300.0) == "TER > 40"
    with pytest.raises(MsgcoreError):
        P.bucket_of(-1.0)


def test_bucket_table_do_nothing_column_is_the_mt_scored_per_bucket():
    mt = ["a b c", "a b x", "x y z w"]
    refs = ["a b c", "a b c", "a b c d"]
    rows = P.bucket_table(mt, refs, {"copy": list(mt)})
    assert [r["MT quality"] for r in rows] == ["TER = 0 (perfect MT)", "20 < TER ≤ 40", "TER > 40"]  # 0, 33.3, 100
    assert [r["sentences"] for r in rows] == [1, 1, 1]
    for row in rows:
        assert row[P.DO_NOTHING] == row["copy"]


def test_do_nothing_equals_scoring_mt_against_pe():
    corpus = triplets([("s1", "Das ist gut .", "Das ist gut ."), ("s2", "das ist schlecht", "Das ist nicht schlecht")])
    hyps = P.do_nothing(corpus)
    assert hyps == corpus.sources[1]
    scores = P.ape_scores(hyps, corpus.target)
    assert scores["TER"] == corpus_score("ter", corpus.sources[1], corpus.target, case_sensitive=True).score
    assert scores["TER"] > scores["TER (ci)"]  # "das" vs "Das" counts only when cased
    assert P.untouched(hyps, corpus.sources[1]) == 100.0


def test_ensemble_rules():
    ratios = (1.0, 0.8)
    dev = {}
    for i, system in enumerate(P.ARCHITECTURES):
        dev[system, 1.0] = {"TER": 20.0 + i, "BLEU": 60.0 + i}  # alpha 1: better TER ... 
        dev[system, 0.8] = {"TER": 20.5 + i, "BLEU": 61.0 + i}  # ... alpha 0.8: better BLEU
    sets = P.ensemble_sets(dev, ratios, top_n=(2,))
    first = list(P.ARCHITECTURES)[0]
    assert sets["Ens_set_1-top2"] == [(first, 1.0), (first, 0.8)]
    assert sets["Ens_set_2-top1"] == [(s, 1.0) for s in P.ARCHITECTURES]
    assert len(sets["Ens_set_2-top2"]) == 8
    assert sets["Ens_set_3"] == [(s, a) for s in P.ARCHITECTURES for a in (1.0, 0.8)]


def test_official_upsampling():
    assert P.official_times(100, 200, 1 / 3) == 1
    assert P.official_times(100, 2000, 1 / 3) == 10
    with pytest.raises(MsgcoreError, match="official_share"):
        P.official_times(100, 200, 1.0)


def test_bad_options_give_one_line_errors():
    with pytest.raises(MsgcoreError, match="unknown scale") as error:
        P.check_options("huge", 0)
    assert "\n" not in str(error.value)
    with pytest.raises(MsgcoreError, match="seed"):
        P.check_options("smoke", -1)


def test_from_pretrained_starts_as_the_pretrained_model_reading_mt():
    torch.manual_seed(0)
    cfg = TriceConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, encoder_layers=2, decoder_layers=2,
                      fine_layers=0, dropout=0.0)
    single = TriceTransformer(cfg).eval()
    base = {k: v for k, v in cfg.to_dict().items() if k in TransformerConfig.__dataclass_fields__}
    src, mt, tgt = torch.randint(4, 40, (2, 7)), torch.randint(4, 40, (2, 5)), torch.randint(4, 40, (2, 4))
    masks = [torch.ones_like(src, dtype=torch.bool), torch.ones_like(mt, dtype=torch.bool)]
    expected = single.decode(tgt, single.encode([mt], masks[1:])).logits
    for fields in (dict(multi_source="parallel"), dict(multi_source="sequential", mt_future_mask=False),
                   dict(joint_encoder=False)):
        model = from_pretrained(single, PostechConfig(**{**base, "pre_norm": True, "embedding_norm": True, **fields})).eval()
        got = model.decode(tgt, model.encode([src, mt], masks)).logits
        assert torch.allclose(got, expected, atol=1e-6)
    with pytest.raises(MsgcoreError, match="does not fit"):
        from_pretrained(single, PostechConfig(**{**base, "pre_norm": False}))


def test_dual_source_control_ignores_src_in_the_encoder():
    torch.manual_seed(0)
    cfg = PostechConfig(vocab_size=40, d_model=16, n_heads=2, d_ff=32, encoder_layers=2, decoder_layers=1,
                        dropout=0.0, joint_encoder=False)
    model = P.PostechAPE(cfg).eval()
    mt = torch.randint(4, 40, (1, 5))
    outs = [model.encode([torch.randint(4, 40, (1, 6)), mt], [torch.ones(1, 6, dtype=torch.bool),
                                                             torch.ones(1, 5, dtype=torch.bool)])[1].hidden
            for _ in range(2)]
    assert torch.equal(outs[0], outs[1])  # E_joint does not depend on src without the joint attention


# ---- the claims and the evidence they are judged on (msgcore.verdicts) -------------------------------------

def history(steps: int) -> list[dict]:
    """A converged run's log rows: a falling loss, four validations whose dev BLEU rises then stays flat over the
    last quarter, a small dev noise, and the trainer's cumulative token counts."""
    points = [steps * k // 4 for k in (1, 2, 3, 4)]
    tokens = [{"source_tokens": 100 * p, "target_tokens": 90 * p} for p in points]
    return ([{"kind": "train", "step": p, "loss": 6.0 - p / steps, **t} for p, t in zip(points, tokens)] +
            [{"kind": "valid", "step": p, "valid_bleu": bleu, "valid_noise": noise, **t}
             for p, bleu, noise, t in zip(points, (20.0, 21.0, 21.05, 21.05), (None, 0.01, 0.01, 0.01), tokens)])


def damaged(sentences, key: str, rate: float) -> list[str]:
    """The sentences with words dropped at `rate`, differently for each key (a system's stand-in outputs)."""
    import random

    rng = random.Random(key)
    return [" ".join(w for w in s.split() if rng.random() > rate) or s for s in sentences]


def fake_chapter(quality: float = 0.1, generic_quality: float = 0.1, start_quality: float = 0.3):
    """Chapter 4 at smoke scale with three seeds and 60 dev and test triplets, as `run_chapter` leaves it, without training: every run's log rows
    (the denoiser's included), and every output the claims and gates read already decoded. The MT drops 30% of the
    post-edit's words; fine-tuned models drop about `quality`, generic models `generic_quality`, the start (the
    denoiser copying mt) `start_quality` (0.3: it is the MT)."""
    import random
    from types import SimpleNamespace

    from msgcore.foundations.denoiser import DENOISER_SCALES

    scale = replace(P.POSTECH_SCALES["smoke"], seeds=(0, 1, 2), dev_examples=60, test_examples=60)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    corpora = {}
    for split, n in (("train", 40), ("val", scale.dev_examples), ("test", scale.test_examples)):
        pe = [" ".join(rng.choices(words, k=8)) for _ in range(n)]
        mt = damaged(pe, f"mt {split}", 0.3)
        corpora[split] = triplets([(f"source {i}", m, p) for i, (m, p) in enumerate(zip(mt, pe))])
    keys = [(s, a, sd) for s in [*P.ARCHITECTURES, P.DUAL, P.CONCAT] for a in (P.GENERIC, *scale.ratios)
            for sd in scale.seeds]
    steps = {True: scale.generic.max_steps, False: scale.finetune.max_steps}
    denoiser = SimpleNamespace(run=SimpleNamespace(history=history(DENOISER_SCALES["smoke"].pretrain.max_steps)),
                               scale=DENOISER_SCALES["smoke"])
    ch = SimpleNamespace(scale=scale, seed=0, ape=SimpleNamespace(corpora=corpora), outputs={}, denoiser=denoiser,
                         runs={key: SimpleNamespace(history=history(steps[key[1] == P.GENERIC]), model=None)
                               for key in keys})
    for split in ("val", "test"):
        refs, mt = corpora[split].target, list(corpora[split].sources[1])
        ch.outputs[P.INITIAL_OUTPUTS, split] = mt if start_quality == 0.3 else damaged(refs, "start", start_quality)
        ch.outputs[P.CONCAT_START_OUTPUTS, split] = damaged(refs, "concat start", 0.5)
        for key in keys:
            rate = generic_quality if key[1] == P.GENERIC else quality
            ch.outputs[P.run_name(*key), split] = damaged(refs, str(key), rate + 0.02 * (len(str(key)) % 3))
        ch.outputs["ensemble", split] = damaged(refs, "ensemble", quality)
    return ch


MEMBERS = [(system, 1.0) for system in P.ARCHITECTURES]


def chapter_evidence(ch=None):
    ch = ch or fake_chapter()
    return {**P.chapter_systems(ch, "ensemble", MEMBERS), **P.floor_systems(ch)}, P.trained_gates(ch)


def judged(ch=None) -> dict[str, V.Verdict]:
    systems, gates = chapter_evidence(ch)
    return {v.id: v for v in V.judge_all(P.declared_claims("small"), systems, gates)}


def test_declared_claims_name_only_systems_floors_and_gates_the_chapter_produces():
    systems, gates = chapter_evidence()
    for scale in P.POSTECH_SCALES:
        claims = P.declared_claims(scale)
        verdicts_ = V.judge_all(claims, systems, gates)
        assert {c.id for c in claims} >= {"P1", "P2", "P5-dev", "P5-test", "P6a", "P6b", "P7", "P8", "O1", "O2"}
        for claim, verdict in zip(claims, verdicts_):
            if claim.id == "P8":  # declared, never run: our synthetic MT cannot test the paper's filter
                assert verdict.verdict == V.NOT_RUN and "real machine translations" in verdict.reason
                continue
            assert set(claim.systems()) <= set(systems), claim.id
            assert claim.gates == P.GATES, claim.id  # every APE claim rests on the start and generic gates
            assert verdict.verdict != V.NOT_RUN and verdict.converged, (claim.id, verdict.reason)
            assert P.DO_NOTHING in claim.floors and P.CONSTANT in claim.floors
            assert claim.metric == "BLEU" or not claim.higher_is_better  # TER (and its means): lower is better
            assert "validates on dev BLEU" in claim.claim  # the stages' dev metric, said in the claim


def test_every_better_claim_scales_its_smallest_effect_to_our_level():
    claims = {c.id: c for c in P.declared_claims("small")}
    assert claims["P1"].paper_baseline == pytest.approx(14.8875)  # Table 2: the mean α = 1 dev TER
    assert claims["P2"].paper_baseline == pytest.approx(15.02)  # Table 2: the mean generic dev TER
    assert claims["P6a"].paper_baseline == 16.84 and claims["P5-dev"].paper_baseline == 77.68
    for claim in claims.values():
        if claim.kind == "better":
            assert claim.paper_baseline or (claim.margin is not None and claim.margin_reason), claim.id
    verdicts_ = judged()
    ch = fake_chapter()
    do_nothing = P.ape_scores(P.mt_outputs(ch, "test"), P.references(ch, "test"))["TER"]
    assert verdicts_["P6a"].smallest_effect == pytest.approx(0.73 / 2 * do_nothing / 16.84)
    assert "at our level" in verdicts_["P6a"].effect
    assert verdicts_["O2"].smallest_effect == P.MASK_MARGIN


def test_every_run_carries_its_pretraining_generic_phase_and_fine_tuning():
    ch = fake_chapter()
    systems, _ = chapter_evidence(ch)
    architecture, alpha = P.best_single(ch)
    for seed in (0, 1, 2):
        names = [stage.name for stage in systems[P.BEST].run(seed).stages]
        assert names == ["denoising pre-training (dev: reconstruction BLEU)",
                         f"{architecture}: generic phase (dev BLEU)",
                         f"{architecture}: fine-tuning α = {alpha:g}, seed {seed} (dev BLEU)"]
    for name, system in systems.items():
        if system.floor:
            continue
        seeds = {k for by_metric in system.measures.values() for m in by_metric.values() for k in m.scores}
        assert {run.seed for run in system.runs} == seeds, name  # one run per scored seed id, no more
        for run in system.runs:
            assert run.stages[0].name.startswith("denoising pre-training") and run.target_tokens, name
            assert all(stage.higher_is_better for stage in run.stages)  # dev BLEU, whatever the claim's metric
    ensemble = systems[P.ENSEMBLE]  # its one seed id: the fine-tuning seed its members share
    assert [run.seed for run in ensemble.runs] == [0]
    names = [stage.name for stage in ensemble.run(0).stages]
    assert len(names) == 1 + 2 * len(MEMBERS)  # pre-training, then each member's generic phase and fine-tuning
    assert all(f"{system}: fine-tuning α = 1, seed 0 (dev BLEU)" in names for system, _ in MEMBERS)
    assert len(systems[P.TUNED].run(0).stages) == 1 + 2 * len(P.ARCHITECTURES)
    assert len(systems[P.GENERIC_EACH].run(0).stages) == 1 + len(P.ARCHITECTURES)
    assert [r.seed for r in systems[P.JOINT_SEQ].runs] == [r.seed for r in systems[P.DUAL].runs] == [0, 1, 2]


def test_p5_compares_the_ensemble_with_the_best_single_model_by_dev_bleu():
    ch = fake_chapter()
    systems, _ = chapter_evidence(ch)
    claims = {c.id: c for c in P.declared_claims("small")}
    assert claims["P5-dev"].baseline == claims["P5-test"].baseline == P.BEST_BLEU
    dev = P.dev_table(ch)
    best_bleu = max(dev[key]["BLEU"] for key in dev if key[1] != P.GENERIC)
    assert systems[P.BEST_BLEU].values(P.DEV, "BLEU") == [pytest.approx(best_bleu)]
    assert judged(ch)["P5-dev"].verdict == V.INDICATIVE  # one ensemble, on the chapter's seed


def test_floors_are_floors_scored_exactly_as_the_systems():
    ch = fake_chapter()
    systems, _ = chapter_evidence(ch)
    floors_ = P.floor_systems(ch)
    mt, refs = P.mt_outputs(ch, "test"), P.references(ch, "test")
    for floor in floors_.values():
        assert floor.floor and not floor.runs
        assert all(set(m.scores) == {V.FLOOR} for by in floor.measures.values() for m in by.values())
    for label in P.CLAIM_METRICS:
        ours, theirs = systems[P.BEST].measure(P.TEST, label), floors_[P.DO_NOTHING].measure(P.TEST, label)
        assert (ours.signature, ours.sentences) == (theirs.signature, theirs.sentences)
    assert floors_[P.DO_NOTHING].values(P.TEST, "TER") == [P.ape_scores(mt, refs)["TER"]]
    assert floors_[P.DO_NOTHING].values(P.TEST, "BLEU") == [corpus_score("bleu", mt, refs).score]
    assert floors_[P.INITIAL].values(P.TEST, "TER") is None  # decoded on dev only
    assert floors_[P.CONSTANT].values(P.DEV, "TER")[0] > floors_[P.DO_NOTHING].values(P.DEV, "TER")[0]
    half = P.held_out_half(ch)
    assert floors_[P.DO_NOTHING].values(P.DEV_HELD_OUT, "TER") == [
        P.ape_scores(P.mt_outputs(ch, "val")[half:], P.references(ch, "val")[half:])["TER"]]
    pooled = floors_[P.DO_NOTHING].measure(P.DEV, P.ARCHITECTURES_TER)  # the MT once per model: its own TER
    assert pooled.values() == [pytest.approx(floors_[P.DO_NOTHING].values(P.DEV, "TER")[0])]
    assert pooled.signature == systems[P.TUNED].measure(P.DEV, P.ARCHITECTURES_TER).signature


def test_a_pooled_measure_is_the_mean_ter_of_its_models_with_shared_resamplings():
    refs = ["a b c d", "e f g h", "i j k l"]
    outputs = [["a b c d", "e f x h", "i j"], ["a c d", "e f g h", "i j k l"]]
    measure = P.mean_ter_measure(0, outputs, refs)
    expected = sum(P.ape_scores(hyps, refs)["TER"] for hyps in outputs) / 2
    assert measure.scores == {0: pytest.approx(expected)} and measure.sentences == 3
    assert len(measure.replicates[0]) > 1 and measure.signature.startswith("mean of 2 models'")


def test_gates_print_the_papers_figures_and_can_fail():
    gates = {gate.name: gate for gate in chapter_evidence()[1]}
    assert set(gates) == set(P.GATES) and all(gate.passed for gate in gates.values())
    assert "−0.73 test TER" in gates[P.GATE_START].paper and "−0.19 to +0.02 dev TER" in gates[P.GATE_START].paper
    assert "Table 2" in gates[P.GATE_GENERIC].paper
    assert gates[P.GATE_START].value == pytest.approx(0.0)  # the start is the MT: it loses nothing
    assert gates[P.GATE_START].target == 0.2 and not gates[P.GATE_START].higher_is_better
    # today's evidence: a start 1.57 TER behind do-nothing, generic models worse than their start
    behind = {gate.name: gate for gate in P.trained_gates(fake_chapter(start_quality=0.5))}
    assert not behind[P.GATE_START].passed
    worse = {gate.name: gate for gate in P.trained_gates(fake_chapter(generic_quality=0.6))}
    assert not worse[P.GATE_GENERIC].passed and worse[P.GATE_GENERIC].value < 0
    for verdict in judged(fake_chapter(generic_quality=0.6)).values():
        assert verdict.id == "P8" or verdict.reason.startswith("gate failed"), verdict.id


def test_a_system_worse_than_doing_nothing_is_not_reproduced_the_other_way():
    verdicts_ = judged(fake_chapter(quality=0.6))  # fine-tuned models drop 60% of the words; the MT only 30%
    assert verdicts_["P6a"].verdict == V.NOT_REPRODUCED and "the other way" in verdicts_["P6a"].reason
    assert verdicts_["P6a-ens"].verdict == V.INDICATIVE and "leans against" in verdicts_["P6a-ens"].reason
    assert verdicts_["P6b"].reason.startswith("below floor")  # do-nothing is a floor of the concatenation claim


def write_chapter1(path, **identity):
    import json

    system = {"name": P.CHAPTER1_TRICE, "floor": False, "updates": 400, "runs": [],
              "measures": {P.CHAPTER1_TEST: {"TER": {"scores": {"0": 21.8}}, "BLEU": {"scores": {"0": 66.7}}}}}
    path.write_text(json.dumps({"chapter": "1. TRICE", "scale": "smoke", "commit": "abc", "claims": [],
                                "systems": [system], **identity}))


def test_chapter1s_figure_says_when_it_is_stale(tmp_path):
    from msgcore import chapters

    path = tmp_path / "ch01_trice.json"
    write_chapter1(path)  # written before results carried their evidence: stale
    trice = P.chapter1_trice(path)
    assert trice["scores"] == {"TER": [21.8], "BLEU": [66.7]} and trice["stale"]
    assert "STALE: written before results carried" in P.chapter1_label(trice)
    write_chapter1(path, protocol=V.PROTOCOL_VERSION, **chapters.identity("ch01_trice", "smoke"))
    current = P.chapter1_trice(path)
    assert current["stale"] == [] and P.chapter1_label(current) == "TRICE (chapter 1 at smoke, same split)"
    assert P.chapter1_trice(tmp_path / "missing.json") is None


def test_only_the_advice_to_detokenize_is_dropped(caplog):
    """APE text is tokenized as the shared task distributes it: sacreBLEU's advice to detokenize is dropped, and
    every other sacreBLEU message still reaches the log."""
    import logging
    sacrebleu_log, lines = logging.getLogger("sacrebleu"), ["ein kleiner test ."] * 120
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        corpus_score("bleu", lines, lines)
    assert any("detokenize" in r.getMessage() for r in caplog.records)  # sacreBLEU gives the advice unfiltered
    caplog.clear()
    sacrebleu_log.addFilter(P.TOKENIZED_TEXT_ADVICE)
    try:
        with caplog.at_level(logging.WARNING, logger="sacrebleu"):
            corpus_score("bleu", lines, lines)
            sacrebleu_log.warning("another warning")
        assert [r.getMessage() for r in caplog.records] == ["another warning"]
    finally:
        sacrebleu_log.removeFilter(P.TOKENIZED_TEXT_ADVICE)
