"""Chapter 3's recipes (msgcore/experiments/marge.py): the language matrices, P@1, the zero-shot layout,
scales and ablation names, and a cached toy pre-training run."""
import pytest
import torch

from msgcore.experiments import marge as exp
from msgcore.retrieval import Links, RetrievalConfig
from msgcore.utils import MsgcoreError


from tests.test_marge import one_thread  # noqa: F401  (autouse: one thread, as in the model tests)


def links(pairs):
    t, e = zip(*pairs)
    n = len(pairs)
    return Links(torch.tensor(t), torch.tensor(e), torch.ones(n), torch.zeros(n))


def test_language_matrix_counts_links_by_target_and_evidence_language():
    langs = ["en", "de", "en", "fr"]
    counts = exp.language_matrix(links([(0, 1), (0, 2), (1, 0), (3, 0), (3, 2), (2, 0)]), langs, ("en", "de", "fr"))
    assert counts == [[2, 1, 0], [1, 0, 0], [2, 0, 0]]
    assert exp.row_percent(counts)[0] == pytest.approx([200 / 3, 100 / 3, 0])


def test_neighbour_language_matrix_never_counts_a_document_itself():
    g = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]]), dim=-1)
    counts = exp.neighbour_language_matrix(g, ["en", "de", "en", "de"], ("en", "de"), k=1)
    assert counts == [[0, 2], [2, 0]]  # each document's nearest other is its translation


def test_precision_at_1_finds_aligned_rows_and_misses_shuffled_ones():
    e = torch.nn.functional.normalize(torch.randn(6, 8), dim=-1)
    scores = exp.precision_at_1({"en": e, "de": e + 0.01, "fr": e[torch.tensor([1, 0, 3, 2, 5, 4])]})
    assert scores["en", "de"] == 1.0 and scores["de", "en"] == 1.0 and scores["en", "fr"] == 0.0
    assert len(scores) == 6


class WordTokenizer:
    bos_id, eos_id, pad_id, vocab_size = 1, 2, 0, 40

    def encode_batch(self, texts):
        return [[10 + int(w) for w in t.split()] for t in texts]

    def lang_id(self, lang):
        return {"en": 3, "de": 4}[lang]


def test_zero_shot_corpus_reads_the_source_as_a_document_and_prompts_with_the_target_tag():
    encoded = exp.zero_shot_corpus(WordTokenizer(), ["1 2", "3"], ["4 5 6", "7"], "de")
    assert encoded.sources == [[[1, 11, 12, 2], [1, 13, 2]]]
    assert encoded.target == [[14, 15, 16], [17]] and encoded.target_prefix == 4


def test_bad_scale_or_ablation_is_a_one_line_error():
    with pytest.raises(MsgcoreError, match="unknown scale 'huge'") as error:
        exp.get_marge_scale("huge")
    assert "\n" not in str(error.value)
    with pytest.raises(MsgcoreError, match="unknown ablation"):
        exp.ablation("no encoder")
    assert exp.ablation("β = 0 (no relevance bias)") == {"beta": 0.0}


def toy_scale():
    return exp.MargeScale(dict(d_model=32, n_heads=2, d_ff=64, encoder_layers=2, decoder_layers=2, relevance_layers=1,
                               decoder_self_only_layers=1, dropout=0.0, beta_init=10.0),
                          images=30, shard_images=3, retrieval=RetrievalConfig(refresh_every=5, k_mono=0.5, k_cross=1,
                                                                               max_tokens=60, max_docs=6),
                          steps=10, lr=1e-3, warmup=2, finetune=exp._ft(2), ablation_steps=10)


class ToyTok:
    bos_id, eos_id, pad_id = exp.BOS, exp.EOS, exp.PAD

    def __init__(self, vocab):
        self.vocab_size = len(vocab) + 5


def test_train_marge_goes_through_the_run_cache_and_beta_zero_stays_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path))
    docs, val = exp.toy_documents(30, seed=0), exp.toy_documents(10, seed=1)
    tok, scale = ToyTok(docs.vocab), toy_scale()
    first = exp.train_marge(docs, val, tok, scale, torch.device("cpu"), steps=10)
    assert not first.reused and first.log[-1]["final"] and len(first.log) == 3
    assert first.log[0]["links_by_language"] and sum(map(sum, first.log[0]["links_by_language"])) > 0
    again = exp.train_marge(docs, val, tok, scale, torch.device("cpu"), steps=10)
    assert again.reused and all(torch.equal(a, b) for a, b in zip(first.model.state_dict().values(),
                                                                    again.model.state_dict().values()))
    control = exp.train_marge(docs, val, tok, scale, torch.device("cpu"), steps=10, change={"beta": 0.0})
    assert not control.reused and control.model.betas() == [0.0]


def test_warm_start_copies_every_tensor_of_the_same_name_and_shape_and_nothing_else():
    from msgcore.models.marge import MargeTransformer

    scale = toy_scale()
    torch.manual_seed(0)
    model = MargeTransformer(exp.marge_config(ToyTok({}), scale))
    torch.manual_seed(1)
    donor = MargeTransformer(exp.marge_config(ToyTok({}), scale, encoder_layers=1, relevance_layers=1))
    before = {n: t.clone() for n, t in model.state_dict().items()}
    copied = exp.warm_start(model, donor)
    theirs = donor.state_dict()
    assert copied and "encoder.layers.0.self_attn.q_proj.weight" in copied
    assert not any(n.startswith("encoder.layers.1.") for n in copied)  # the donor has no second encoder layer
    for name, t in model.state_dict().items():
        assert torch.equal(t, theirs[name] if name in copied else before[name]), name


def test_the_main_runs_warm_start_and_the_random_init_ablation_does_not(tmp_path, monkeypatch):
    from msgcore.models.marge import MargeTransformer

    monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path))
    docs, val = exp.toy_documents(30, seed=0), exp.toy_documents(10, seed=1)
    tok, scale = ToyTok(docs.vocab), toy_scale()
    torch.manual_seed(5)
    donor = MargeTransformer(exp.marge_config(tok, scale))
    warm = exp.train_marge(docs, val, tok, scale, torch.device("cpu"), steps=0, donor=donor)
    cold = exp.train_marge(docs, val, tok, scale, torch.device("cpu"), steps=0, donor=donor,
                           change=exp.ablation("random initialisation (the paper's start)"))
    for name, t in donor.state_dict().items():  # no update was taken: the warm run is the donor itself
        assert torch.equal(warm.model.state_dict()[name], t)
    assert not torch.equal(cold.model.state_dict()["encoder.embed.tokens.weight"],
                           donor.state_dict()["encoder.embed.tokens.weight"])
    with pytest.raises(MsgcoreError, match="unknown init 'imagenet'"):
        exp.train_marge(docs, val, tok, scale, torch.device("cpu"), steps=0, change={"init": "imagenet"})
