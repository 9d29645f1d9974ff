"""Chapter 4's recipes (msgcore.experiments.postech_ape): the eSCAPE filter, the synthetic MT, MT-quality
buckets, the do-nothing baseline, the ensemble rules, initialisation from a pre-trained model, option errors."""
from __future__ import annotations

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

def history(generic: bool) -> list[dict]:
    """A run's log rows: a falling loss and two validations with a flat dev BLEU (a converged run)."""
    last = P.POSTECH_SCALES["smoke"].generic.max_steps if generic else P.POSTECH_SCALES["smoke"].finetune.max_steps
    return [{"kind": "train", "step": 1, "loss": 6.0}, {"kind": "train", "step": last, "loss": 3.0},
            {"kind": "valid", "step": 1, "valid_bleu": 20.0}, {"kind": "valid", "step": last, "valid_bleu": 20.1}]


def damaged(sentences, key: str, rate: float) -> list[str]:
    """The sentences with words dropped at `rate`, differently for each key (a system's stand-in outputs)."""
    import random

    rng = random.Random(key)
    return [" ".join(w for w in s.split() if rng.random() > rate) or s for s in sentences]


def fake_chapter(quality: float = 0.1):
    """Chapter 4 at smoke scale as `run_chapter` leaves it, without training: every run's log rows, and every
    output the claims read already decoded (each system drops words at about `quality` ± a little)."""
    import random
    from types import SimpleNamespace

    scale = P.POSTECH_SCALES["smoke"]
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    corpora = {}
    for split, n in (("train", 40), ("val", scale.dev_examples), ("test", scale.test_examples)):
        pe = [" ".join(rng.choices(words, k=8)) for _ in range(n)]
        mt = damaged(pe, f"mt {split}", 0.3)  # the MT: the post-edit with 30% of its words dropped
        corpora[split] = triplets([(f"source {i}", m, p) for i, (m, p) in enumerate(zip(mt, pe))])
    keys = [(s, a, sd) for s in [*P.ARCHITECTURES, P.DUAL, P.CONCAT] for a in (P.GENERIC, *scale.ratios)
            for sd in (0, 1)]
    ch = SimpleNamespace(scale=scale, seed=0, ape=SimpleNamespace(corpora=corpora), outputs={},
                         runs={key: SimpleNamespace(history=history(key[1] == P.GENERIC), model=None) for key in keys})
    for split in ("val", "test"):
        refs = corpora[split].target
        ch.outputs[P.INITIAL_OUTPUTS, split] = list(corpora[split].sources[1])
        for key in keys:
            ch.outputs[P.run_name(*key), split] = damaged(refs, str(key), quality + 0.02 * (len(str(key)) % 3))
        ch.outputs["ensemble", split] = damaged(refs, "ensemble", quality)
    return ch


def chapter_evidence(quality: float = 0.1):
    ch = fake_chapter(quality)
    members = [(system, 1.0) for system in P.ARCHITECTURES]
    return {**P.chapter_systems(ch, "ensemble", members), **P.floor_systems(ch)}, P.trained_gates(ch)


def test_declared_claims_name_only_systems_floors_and_gates_the_chapter_produces():
    systems, gates = chapter_evidence()
    for scale in P.POSTECH_SCALES:
        claims = P.declared_claims(scale)
        judged = V.judge_all(claims, systems, gates)
        assert {c.id for c in claims} >= {"P1", "P2", "P5-dev", "P5-test", "P6a", "P6b", "P7", "P8", "O1", "O2"}
        for claim, verdict in zip(claims, judged):
            assert set(claim.gates) <= {gate.name for gate in gates}
            if claim.id == "P8":  # declared, never run: our synthetic MT cannot test the paper's filter
                assert verdict.verdict == V.NOT_RUN and "real machine translations" in verdict.reason
                continue
            assert set(claim.systems()) <= set(systems), claim.id
            assert verdict.verdict != V.NOT_RUN and verdict.converged, claim.id
            if claim.metric in ("TER", "BLEU"):
                assert P.DO_NOTHING in claim.floors and P.CONSTANT in claim.floors


def test_systems_worse_than_doing_nothing_are_below_floor_not_judged():
    systems, gates = chapter_evidence(quality=0.6)  # every system drops 60% of the words; the MT only 30%
    verdicts_ = {v.id: v for v in V.judge_all(P.declared_claims("small"), systems, gates)}
    for claim in ("P6a", "P6a-ens", "P6b", "P7"):
        assert verdicts_[claim].verdict == V.NOT_DECIDED and verdicts_[claim].reason.startswith("below floor"), claim


def test_floors_are_do_nothing_a_constant_chosen_elsewhere_and_the_untrained_start():
    ch = fake_chapter()
    floors_ = P.floor_systems(ch)
    mt, refs = P.mt_outputs(ch, "test"), P.references(ch, "test")
    assert floors_[P.DO_NOTHING].values("test", "TER") == [P.ape_scores(mt, refs)["TER"]]
    assert floors_[P.DO_NOTHING].values("test", "BLEU") == [corpus_score("bleu", mt, refs).score]
    assert floors_[P.INITIAL].values("test", "TER") is None  # decoded on dev only
    assert floors_[P.CONSTANT].values("dev", "TER")[0] > floors_[P.DO_NOTHING].values("dev", "TER")[0]
    half = P.held_out_half(ch)
    assert floors_[P.DO_NOTHING].values(P.DEV_HELD_OUT, "TER") == [
        P.ape_scores(P.mt_outputs(ch, "val")[half:], P.references(ch, "val")[half:])["TER"]]


