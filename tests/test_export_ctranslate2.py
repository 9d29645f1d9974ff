"""msgcore's Transformer exported to CTranslate2 (msgcore.export_ctranslate2) decodes as msgcore does.

CTranslate2 is a benchmark-only dependency (the peers venv); without it these tests are skipped."""
import pytest
import torch

from msgcore.batching import collate, encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.generation import GenerationConfig
from msgcore.model import Transformer, preset
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import translate_encoded
from msgcore.utils import MsgcoreError

ctranslate2 = pytest.importorskip("ctranslate2")
from msgcore.export_ctranslate2 import export, translate  # noqa: E402  (after the skip)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    corpus = synthetic_corpus(40, num_sources=1, seed=3)
    tokenizer = Tokenizer.train(corpus.texts(), vocab_size=80, cache_dir=tmp_path_factory.mktemp("tok"))
    encoded = encode_corpus(corpus, tokenizer)
    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, d_model=32,
                               d_ff=64, dropout=0.0))
    batch = collate(encoded, range(len(encoded)))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):  # a half-trained model: outputs that end with </s>, not random tokens up to the limit
        loss = model.loss(batch) / batch.num_target_tokens
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), tokenizer, encode_corpus(corpus.subset(range(16)), tokenizer)


@pytest.mark.parametrize("beam", [1, 4])
def test_ctranslate2_decodes_the_exported_weights_as_msgcore_does_at_batch_size_1(setup, tmp_path, beam):
    model, tokenizer, encoded = setup
    cfg = GenerationConfig(beam_size=beam)
    ours = translate_encoded(model, tokenizer, encoded, torch.device("cpu"), cfg)
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    translator = ctranslate2.Translator(str(export(model, tokenizer, tmp_path / "ct2")), device="cpu")
    export(model, tokenizer, tmp_path / "ct2-int8", "int8")  # quantizing works on copies of the weights
    assert all(torch.equal(weights[name], value) for name, value in model.state_dict().items())  # left untouched
    assert translate(translator, tokenizer, encoded, cfg, batch_size=1) == ours
    assert len(set(ours)) > 1  # not one degenerate output for every sentence


def test_an_unsupported_model_or_quantization_is_refused_in_one_line(setup, tmp_path):
    model, tokenizer, _ = setup
    with pytest.raises(MsgcoreError, match="quantization 'fp8': choose one of float32, int8"):
        export(model, tokenizer, tmp_path / "a", "fp8")
    post_norm = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size, pre_norm=False))
    with pytest.raises(MsgcoreError, match="pre-norm"):
        export(post_norm, tokenizer, tmp_path / "b")
    assert not (tmp_path / "b").exists()
