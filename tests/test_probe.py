"""The throughput probe (msgcore.probe): its quick pass on the CPU, in worker processes, and its report."""
import json

import torch

from msgcore import probe


def test_random_batches_have_multi30ks_lengths_and_no_reserved_ids():
    data = probe.random_corpus(50)
    lengths = [len(t) for t in data.target]
    assert len(data) == 50 and min(lengths) >= probe.LENGTHS[0] and max(lengths) < probe.LENGTHS[1]
    assert all(ids[-1] == probe.EOS and min(ids[:-1]) >= 4 for ids in data.sources[0])


def test_the_quick_probe_times_training_and_decoding_and_writes_its_report(tmp_path):
    assert probe.main(["--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    train, decode = report["rows"]
    assert train["measure"] == "train" and train["preset"] == "tiny" and train["updates timed"] == 3
    assert train["ms per update"] > 0 and train["target tokens/s"] > 0
    assert decode["generated tokens/s"] > 0 and report["precision"] == "bf16" and report["quick"]
    text = next(tmp_path.glob("*.md")).read_text()
    assert "| train | tiny | 512 | 1 |" in text
    assert text.count("Where the time goes") == 2 and "aten::" in train["profile"] and "aten::" in decode["profile"]
    assert probe.book_precision(torch.device("cpu")) == "bf16"
