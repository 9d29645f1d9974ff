"""TRICE's stages run end to end on the toy corpus, and each stage starts from the one before."""
from dataclasses import replace

import torch

from msgcore.batching import encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.experiments import TranslationData
from msgcore.experiments.trice import (TriceScale, pretrain, train_dualbart, train_dualtrans, train_mbart_trans,
                                       train_trice)
from msgcore.models.trice import TriceTransformer
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import TrainConfig

CPU = torch.device("cpu")
STEPS = TrainConfig(lr=2e-3, warmup_steps=5, max_tokens=600, max_epochs=1, max_steps=6, patience=0,
                    valid_max_sentences=8, log_every=2, progress=False)
SCALE = TriceScale("tiny", dict(d_model=32, d_ff=64, dropout=0.0), STEPS, STEPS, STEPS, STEPS, pretrain_sentences=40)


def toy_data(tmp_path, num_sources=2):
    corpora = {split: synthetic_corpus(60 if split == "train" else 8, num_sources=num_sources, seed=0, split=split)
               for split in ("train", "val")}
    train = corpora["train"]
    tok = Tokenizer.train(train.texts(), vocab_size=80, langs=(*train.source_langs, train.target_lang),
                          cache_dir=tmp_path / "tok")
    return TranslationData(tok, corpora, {s: encode_corpus(c, tok) for s, c in corpora.items()})


def test_stages_chain_and_every_system_trains(tmp_path):
    data = toy_data(tmp_path)
    pretrained, _ = pretrain(data, SCALE, CPU, tmp_path / "pre")
    before = pretrained.encoder.layers[0].ffn.w1.weight.clone()
    stage1, stage2 = train_trice(pretrained, data, SCALE, CPU, tmp_path / "trice")
    torch.testing.assert_close(pretrained.encoder.layers[0].ffn.w1.weight, before)  # the pre-trained model is kept
    assert isinstance(stage2.model, TriceTransformer) and stage2.model.fine_encoder is not None
    assert not torch.equal(stage1.model.encoder.layers[0].ffn.w1.weight, before)  # stage 1 trained
    assert any(r["kind"] == "valid" for r in stage2.history)
    dualbart = train_dualbart(pretrained, data, SCALE, CPU, tmp_path / "dualbart")
    assert dualbart.model.fine_encoder is None and not dualbart.model.cfg.separated_cross_attention
    dualtrans = train_dualtrans(data, SCALE, CPU, tmp_path / "dualtrans")
    assert not dualtrans.model.cfg.concatenated_encoding
    single = toy_data(tmp_path, num_sources=1)
    single = replace(single, tokenizer=data.tokenizer,
                     encoded={s: encode_corpus(c, data.tokenizer) for s, c in single.corpora.items()})
    mbart = train_mbart_trans(pretrained, single, SCALE, CPU, tmp_path / "mbart")
    assert mbart.history
