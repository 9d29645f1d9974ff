"""The command line: train, translate and score end to end, and one-line errors on bad input."""
import pytest

from msgcore.__main__ import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    code = main(["train", "--dataset", "synthetic", "--sources", "xa", "--preset", "tiny", "--vocab-size", "60",
                 "--max-steps", "30", "--max-epochs", "1", "--warmup", "10", "--device", "cpu", "--out", str(out)])
    assert code == 0
    return out


def test_train_writes_checkpoints_and_log(trained):
    assert (trained / "best.pt").is_file() and (trained / "last.pt").is_file() and (trained / "log.json").is_file()


def test_translate_and_score(trained, tmp_path, capsys):
    src, ref, hyp = tmp_path / "in.xa", tmp_path / "ref.xt", tmp_path / "out.xt"
    src.write_text("xa-word-1 xa-word-2\nxa-word-3\n")
    ref.write_text("a b\nc\n")
    assert main(["translate", "--checkpoint", str(trained / "best.pt"), "--input", str(src), "--output", str(hyp),
                 "--beam", "2", "--device", "cpu"]) == 0
    assert len(hyp.read_text().splitlines()) == 2
    assert main(["score", "--hyp", str(hyp), "--ref", str(ref), "--metrics", "bleu", "chrf"]) == 0
    out = capsys.readouterr().out
    assert "BLEU" in out and "nrefs:1" in out


def test_translate_keeps_empty_lines_aligned(trained, tmp_path, capsys):
    src, hyp = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("xa-word-1\n\nxa-word-3\n")
    assert main(["translate", "--checkpoint", str(trained / "best.pt"), "--input", str(src), "--output", str(hyp),
                 "--beam", "1", "--device", "cpu"]) == 0
    lines = hyp.read_text().split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # three lines, the empty one kept in place


def test_translate_refuses_a_missing_checkpoint(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("hello\n")
    assert main(["translate", "--checkpoint", str(tmp_path / "none.pt"), "--input", str(src),
                 "--output", str(tmp_path / "o.txt"), "--device", "cpu"]) == 2
    assert "checkpoint not found" in capsys.readouterr().err


def test_translate_refuses_the_wrong_number_of_sources(trained, tmp_path, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("x\n")
    b.write_text("y\n")
    assert main(["translate", "--checkpoint", str(trained / "best.pt"), "--input", str(a), str(b),
                 "--output", str(tmp_path / "o.txt"), "--device", "cpu"]) == 2
    assert "1 source" in capsys.readouterr().err


def test_score_refuses_mismatched_files(tmp_path, capsys):
    hyp, ref = tmp_path / "h.txt", tmp_path / "r.txt"
    hyp.write_text("a\nb\n")
    ref.write_text("a\n")
    assert main(["score", "--hyp", str(hyp), "--ref", str(ref)]) == 2
    err = capsys.readouterr().err
    assert "2" in err and "1" in err and len(err.strip().splitlines()) == 1
