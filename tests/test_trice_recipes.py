"""TRICE's stages run end to end on the toy corpus, each stage starts from the one before, finetuning keeps
the language tags, and the denoiser's reconstruction gate scores copies."""
import pytest
import torch

from msgcore.data import synthetic_corpus
from msgcore.experiments.trice import (TriceScale, single_source_encoded, train_dualbart, train_dualtrans,
                                       train_mbart_trans, train_trice)
from msgcore.foundations.denoiser import DenoiserScale, Tasks, encode_task, model_config, pretrain, reconstruction_bleu
from msgcore.models.trice import TriceTransformer
from msgcore.tokenizer import Tokenizer
from msgcore.recipes import TranslationData
from msgcore.trainer import TrainConfig

CPU = torch.device("cpu")
STEPS = TrainConfig(lr=2e-3, warmup_steps=5, max_tokens=600, max_epochs=1, max_steps=6, patience=0,
                    valid_max_sentences=8, log_every=2, progress=False)
DENOISER = DenoiserScale("tiny", dict(d_model=32, d_ff=64, dropout=0.0), STEPS, pretrain_sentences=40,
                         heldout_sentences=4)
SCALE = TriceScale("toy", STEPS, STEPS, STEPS)


def toy_data(tmp_path, num_sources=2, tok=None):
    corpora = {split: synthetic_corpus(60 if split == "train" else 8, num_sources=num_sources, seed=0, split=split)
               for split in ("train", "val")}
    train = corpora["train"]
    tok = tok or Tokenizer.train(train.texts(), vocab_size=80, langs=(*train.source_langs, train.target_lang),
                                 cache_dir=tmp_path / "tok")
    return TranslationData(tok, corpora, {s: encode_task(c, tok) for s, c in corpora.items()})


def toy_tasks(data):
    train = data.corpora["train"]
    mono = {lang: column[:40] for lang, column in zip((*train.source_langs, train.target_lang),
                                                       (*train.sources, train.target))}
    return Tasks(data.tokenizer, {"m30k": data}, mono)


def test_finetuning_batches_carry_language_tags(tmp_path):
    data = toy_data(tmp_path)
    tok, train = data.tokenizer, data.corpora["train"]
    for k, lang in enumerate(train.source_langs):
        assert all(s[-2:] == [tok.eos_id, tok.lang_id(lang)] for s in data.encoded["train"].sources[k])
    assert all(t[0] == tok.lang_id(train.target_lang) for t in data.encoded["train"].target)
    stage1 = single_source_encoded(data.encoded["train"], seed=0)
    tags = {s[-1] for s in stage1.sources[0]}
    assert tags == {tok.lang_id(lang) for lang in train.source_langs}  # each drawn source keeps its own tag


def test_stages_chain_and_every_system_trains(tmp_path):
    data = toy_data(tmp_path)
    pre = pretrain(toy_tasks(data), DENOISER, CPU, tmp_path / "pre")
    pretrained = pre.model
    assert isinstance(pretrained, TriceTransformer) and pretrained.fine_encoder is None
    assert any(r["kind"] == "valid" for r in pre.history)  # validated on the held-out copy set
    before = pretrained.encoder.layers[0].ffn.w1.weight.clone()
    stage1, stage2 = train_trice(pretrained, data, SCALE, CPU, tmp_path / "trice")
    torch.testing.assert_close(pretrained.encoder.layers[0].ffn.w1.weight, before)  # the pre-trained model is kept
    assert isinstance(stage2.model, TriceTransformer) and stage2.model.fine_encoder is not None
    assert stage2.model.cfg.base_lr == STEPS.lr and stage2.model.cfg.fine_lr == SCALE.fine_lr_ratio * STEPS.lr
    assert not torch.equal(stage1.model.encoder.layers[0].ffn.w1.weight, before)  # stage 1 trained
    assert any(r["kind"] == "valid" for r in stage2.history)
    dualbart = train_dualbart(pretrained, data, SCALE, CPU, tmp_path / "dualbart")
    assert dualbart.model.fine_encoder is None and not dualbart.model.cfg.separated_cross_attention
    dualtrans = train_dualtrans(pretrained, data, SCALE, CPU, tmp_path / "dualtrans")
    assert not dualtrans.model.cfg.concatenated_encoding and dualtrans.model.cfg.d_model == pretrained.cfg.d_model
    single = toy_data(tmp_path, num_sources=1, tok=data.tokenizer)
    mbart = train_mbart_trans(pretrained, single, SCALE, CPU, tmp_path / "mbart")
    assert mbart.history


class Copier(torch.nn.Module):
    """A stand-in model whose `generate` returns its input minus </s> and the tag: a perfect denoiser."""

    def generate(self, sources, source_masks, prefix_id, eos_id, cfg=None, forbidden=()):
        return [[t for t, m in zip(row.tolist(), mask.tolist()) if m][:-2] for row, mask in zip(sources[0], source_masks[0])]


def test_reconstruction_bleu_is_100_for_a_perfect_copier_and_low_for_a_bad_one(tmp_path):
    data = toy_data(tmp_path)
    texts = {"xa": data.corpora["val"].sources[0]}
    assert reconstruction_bleu(Copier(), data.tokenizer, texts, CPU)["xa"] == pytest.approx(100.0)
    torch.manual_seed(0)
    untrained = TriceTransformer(model_config(data.tokenizer, DENOISER, fine_layers=0)).eval()
    assert reconstruction_bleu(untrained, data.tokenizer, texts, CPU)["xa"] < 50


def test_analysis_variants_train_on_the_analysis_budget_beside_their_own_reference(tmp_path):
    """Tables 5-7 on a budget of their own: every variant, and TRICE itself as their reference, gets exactly the
    `analysis` updates; without one, APE's TRICE run is the reference (no retraining)."""
    import types
    from dataclasses import replace

    from msgcore.experiments.trice import analysis_runs, fixed_steps

    data = toy_data(tmp_path)
    pretrained = pretrain(toy_tasks(data), DENOISER, CPU, tmp_path / "pre").model
    stage1, stage2 = train_trice(pretrained, data, SCALE, CPU, tmp_path / "trice")
    ape = {"TRICE stage 1": stage1, "TRICE": stage2}
    analysis = fixed_steps(replace(STEPS, max_epochs=50), 3)
    ch = types.SimpleNamespace(scale=replace(SCALE, analysis=analysis), tasks={"ape": data}, out_dir=tmp_path / "a",
                               device=CPU, seed=0, pretrained=pretrained)
    runs = analysis_runs(ch, ape)
    assert runs["Fine encoder (N_f = 1)"] is not stage2
    assert {max(r["step"] for r in run.history) for run in runs.values()} == {3}
    ch.scale = SCALE
    assert analysis_runs(ch, ape)["Fine encoder (N_f = 1)"] is stage2


def test_ted_runs_return_trices_first_stage_for_its_budget(tmp_path):
    """Table 4's TRICE counts both stages in its budget: `ted_runs` hands back stage 1 beside stage 2."""
    import types

    from msgcore.experiments.trice import ted_runs, updates

    data = toy_data(tmp_path)
    single = toy_data(tmp_path, num_sources=1, tok=data.tokenizer)
    pretrained = pretrain(toy_tasks(data), DENOISER, CPU, tmp_path / "pre").model
    ch = types.SimpleNamespace(scale=SCALE, tasks={"ted": data, "ted_sent": single, "ted_doc": single},
                               out_dir=tmp_path / "ted", device=CPU, seed=0, pretrained=pretrained)
    runs = ted_runs(ch)
    assert list(runs) == ["MBART-TRANS", "MBART-DOCTRANS", "DualBART", "TRICE stage 1", "TRICE"]
    (stage1, read1), (stage2, read2) = runs["TRICE stage 1"], runs["TRICE"]
    assert stage1.model.fine_encoder is None and stage2.model.fine_encoder is not None
    assert read1 is single and read2 is data and updates(stage1) > 0 and updates(stage2) > 0


def test_pretraining_text_keeps_each_sentence_once_and_takes_the_extra_columns(tmp_path):
    from msgcore.foundations.denoiser import monolingual_text

    data = toy_data(tmp_path)
    train = data.corpora["train"]
    tasks = {name: {"train": train} for name in ("m30k", "ape", "ted")}  # the same text three times
    text = monolingual_text(tasks, 0, [("cs", ["ahoj", "ahoj", " "]), (train.target_lang, ["an extra one"])])
    assert text["cs"] == ["ahoj"]
    assert text[train.target_lang] == list(dict.fromkeys(train.target)) + ["an extra one"]
    assert len(monolingual_text(tasks, 8, [])[train.target_lang]) <= 8  # a limit is drawn evenly from the columns


def test_every_sentence_is_noised_once_per_draw_and_dev_reconstructs_a_fixed_noised_draw(tmp_path):
    from dataclasses import replace

    from msgcore.foundations.denoiser import denoising_data

    data = toy_data(tmp_path)
    tasks = toy_tasks(data)
    one = denoising_data(tasks, replace(DENOISER, noise_draws=1, pretrain_copy_ratio=0.0))
    three = denoising_data(tasks, replace(DENOISER, noise_draws=3, pretrain_copy_ratio=0.0))
    n = len(one.encoded["train"].target)
    assert len(three.encoded["train"].target) == 3 * n and three.encoded["train"].target[:n] == one.encoded["train"].target
    assert three.encoded["train"].sources[0][:n] != three.encoded["train"].sources[0][n:2 * n]  # a new draw of noise
    val, refs = three.encoded["val"], three.corpora["val"].target
    assert len(val.target) == len(refs) == DENOISER.heldout_sentences * len(tasks.monolingual)
    assert [data.tokenizer.decode(ids[1:]) for ids in val.target] == refs  # "<lang> pieces" -> the clean sentence
    mask = data.tokenizer.mask_id
    assert sum(mask in ids for ids in val.sources[0]) > len(refs) // 2  # the dev inputs are noised
    assert denoising_data(tasks, DENOISER).encoded["val"].sources == val.sources  # the same draw every time


def test_noised_text_data_draws_from_its_first_seed_and_keeps_one_fixed_dev_draw(tmp_path):
    """The helper behind the denoiser's stage 0 and chapter 3's continued-denoising control: another first seed
    gives other training draws of the same text, the same seeds give the same data, the dev set does not move."""
    from dataclasses import replace

    from msgcore.foundations.denoiser import noised_text_data

    data = toy_data(tmp_path)
    tok, train_corpus, val_corpus = data.tokenizer, data.corpora["train"], data.corpora["val"]
    train_text = {"xa": train_corpus.sources[0][:3], "xt": train_corpus.target[:1]}
    heldout = {"xa": val_corpus.sources[0][:1], "xt": val_corpus.target[:2]}
    scale = replace(DENOISER, noise_draws=2, pretrain_copy_ratio=0.0)
    first = noised_text_data(train_text, heldout, tok, scale, first_seed=0, dev_seed=-1, name="text")
    again = noised_text_data(train_text, heldout, tok, scale, first_seed=0, dev_seed=-1, name="text")
    other = noised_text_data(train_text, heldout, tok, scale, first_seed=1000, dev_seed=-1, name="text")
    train = first.encoded["train"]
    assert len(train.target) == 2 * 4 and train.target[:4] == train.target[4:]  # each sentence once per draw
    assert train.sources == again.encoded["train"].sources and train.target == other.encoded["train"].target
    assert train.sources != other.encoded["train"].sources  # the control's draws are not the denoiser's
    assert first.encoded["val"].sources == other.encoded["val"].sources  # one fixed dev draw
    assert first.corpora["val"].target == heldout["xa"] + heldout["xt"]
    assert first.corpora["val"].name == "text" and not first.synthetic


def test_trices_record_holds_every_stage_from_the_whole_logs_and_a_reused_run_gives_the_same(tmp_path):
    """The protocol's record of a TRICE run: the denoiser's pre-training, stage 1 and stage 2, each from its run's
    whole log (dev curve, dev noise, tokens trained on); the run cache hands back the same log when it reuses a run
    (its best checkpoint is reloaded, its history is not cut there)."""
    import types
    from dataclasses import replace

    from msgcore.experiments.trice import trice_stages

    data = toy_data(tmp_path)
    pre = pretrain(toy_tasks(data), DENOISER, CPU, tmp_path / "pre")
    steps = replace(STEPS, validate_every=2, max_epochs=50)
    scale = replace(SCALE, stage1=steps, stage2=steps)
    ch = types.SimpleNamespace(scale=scale, denoiser=types.SimpleNamespace(run=pre, scale=DENOISER))
    stage1, stage2 = train_trice(pre.model, data, scale, CPU, tmp_path / "trice", stage1_cfg=scale.stage1,
                                 stage2_cfg=scale.stage2)
    stages = trice_stages(ch, stage1, stage2)
    assert [s.name for s in stages] == ["denoising pre-training", "stage 1", "stage 2"]
    for stage in stages[1:]:
        assert [step for step, _ in stage.dev_curve] == [2, 4, 6] and stage.updates == 6
        assert stage.target_tokens > 0 and stage.source_tokens > stage.target_tokens  # two sources in stage 2
        assert stage.dev_noise is not None
    again = train_trice(pre.model, data, scale, CPU, tmp_path / "again", stage1_cfg=scale.stage1,
                        stage2_cfg=scale.stage2)
    assert again[1].reused and trice_stages(ch, *again) == stages
