"""Tests of the book runner (msgcore.book) on tiny temporary books; the kernel tests take a few seconds each."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from msgcore import book

REPO_ROOT = Path(__file__).resolve().parent.parent

TOC = """\
format: jb-book
root: book/intro
parts:
  - caption: Part one
    chapters:
      - file: book/ch_a
        sections:
          - file: book/ch_b
      - file: book/notes
      - file: book/missing
"""


def write_notebook(path: Path, body: str) -> None:
    """A chapter-like notebook: a `parameters` cell, then `body`."""
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                               "language": "python"}})
    nb.cells = [new_markdown_cell(f"# {path.stem}"),
                new_code_cell('scale = "small"\ndevice = "auto"\nseed = 0',
                              metadata={"tags": ["parameters", "remove-cell"]}),
                new_code_cell(body)]
    nbformat.write(nb, path)


@pytest.fixture
def tiny_book(tmp_path: Path) -> Path:
    """A book with two notebook chapters (ch_a, ch_b), a markdown page and a TOC entry with no file."""
    (tmp_path / "book").mkdir()
    (tmp_path / "_toc.yml").write_text(TOC)
    (tmp_path / "_config.yml").write_text("title: tiny\n")
    (tmp_path / "book" / "intro.md").write_text("# Intro\n")
    (tmp_path / "book" / "notes.md").write_text("# Notes\n")
    write_notebook(tmp_path / "book" / "ch_a.ipynb", 'print(f"scale={scale} seed={seed}")')
    write_notebook(tmp_path / "book" / "ch_b.ipynb", "print(seed + 1)")
    return tmp_path


def outputs_text(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_find_chapters_follows_the_toc(tiny_book: Path) -> None:
    chapters = book.find_chapters(tiny_book)
    assert list(chapters) == ["ch_a", "ch_b"]  # TOC order; .md pages and missing files are skipped
    assert chapters["ch_b"] == tiny_book / "book" / "ch_b.ipynb"


def test_repo_toc_lists_the_chapters_in_order() -> None:
    toc = ["ch00_transformer_baseline", "ch01_trice", "ch02_mixrep", "ch03_marge", "ch04_postech_ape",
           "ch05_coverage_nat", "scoreboard", "appendix_performance"]
    present = [name for name in toc if (REPO_ROOT / "book" / f"{name}.ipynb").is_file()]  # a chapter being written has none yet
    assert {"ch00_transformer_baseline", "ch01_trice", "ch05_coverage_nat", "appendix_performance"} <= set(present)
    assert list(book.find_chapters(REPO_ROOT)) == present


def test_select_chapters_accepts_paths_and_keeps_toc_order(tiny_book: Path) -> None:
    chapters = book.find_chapters(tiny_book)
    assert list(book.select_chapters(chapters, ["book/ch_b.ipynb", "ch_a"])) == ["ch_a", "ch_b"]
    assert list(book.select_chapters(chapters, None)) == ["ch_a", "ch_b"]


def test_unknown_chapter_is_a_one_line_error(tiny_book: Path, capsys: pytest.CaptureFixture) -> None:
    code = book.main(["run", "--root", str(tiny_book), "--scale", "small", "--chapter", "ch_zz",
                      "--out", str(tiny_book / "runs" / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "ch_zz" in err and "ch_a, ch_b" in err
    assert not (tiny_book / "runs").exists()


def test_in_place_is_refused_at_smoke_scale(tiny_book: Path, capsys: pytest.CaptureFixture) -> None:
    code = book.main(["run", "--root", str(tiny_book), "--scale", "smoke", "--in-place"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "--in-place" in err and "smoke" in err
    assert not (tiny_book / "runs").exists()


def test_out_may_not_be_the_book_root(tiny_book: Path) -> None:
    with pytest.raises(book.BookError, match="book root"):
        book.run_book(tiny_book, scale="smoke", out=tiny_book)


def test_run_dir_gets_the_outputs_and_committed_notebooks_stay_byte_identical(tiny_book: Path) -> None:
    committed = tiny_book / "book" / "ch_a.ipynb"
    before = committed.read_bytes()
    report = book.run_book(tiny_book, ["ch_a"], "smoke", out=tiny_book / "runs" / "t", seed=7)

    assert report.ok and [r.status for r in report.results] == ["ok"]
    assert committed.read_bytes() == before
    executed = report.run_dir / "book" / "ch_a.ipynb"
    assert "scale=smoke seed=7" in outputs_text(executed)
    assert (report.run_dir / "_toc.yml").is_file() and (report.run_dir / "book" / "intro.md").is_file()
    cells = nbformat.read(executed, as_version=4).cells
    injected = [c for c in cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "remove-cell" in injected[0].metadata.tags
    parameters = [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    assert parameters[0].metadata.tags == ["parameters"]  # shown: a reader edits its scale line


def test_in_place_replaces_the_committed_notebook(tiny_book: Path) -> None:
    committed = tiny_book / "book" / "ch_b.ipynb"
    report = book.run_book(tiny_book, ["ch_b"], "small", out=tiny_book / "runs" / "t", in_place=True, seed=41)
    assert report.ok
    assert "42" in outputs_text(committed)
    assert committed.read_bytes() == (report.run_dir / "book" / "ch_b.ipynb").read_bytes()
    tags = [c.metadata.get("tags", []) for c in nbformat.read(committed, as_version=4).cells]
    assert not any("injected-parameters" in t for t in tags)  # the reader's parameters cell wins
    assert nbformat.read(committed, as_version=4).metadata.papermill.parameters["seed"] == 41


def test_in_place_publishes_the_chapters_scoreboard_file(tiny_book: Path) -> None:
    write_notebook(tiny_book / "book" / "ch_b.ipynb", "import json, os\nos.makedirs('results', exist_ok=True)\n"
                   "json.dump({'chapter': 'b', 'seed': seed}, open('results/ch_b.json', 'w'))")
    report = book.run_book(tiny_book, ["ch_b"], "small", out=tiny_book / "runs" / "t", in_place=True, seed=3)
    assert report.ok
    committed = tiny_book / "book" / "results" / "ch_b.json"
    assert committed.read_bytes() == (report.run_dir / "book" / "results" / "ch_b.json").read_bytes()
    assert '"seed": 3' in committed.read_text()
    assert not (tiny_book / "book" / "results" / "ch_a.json").exists()


def test_a_relative_data_mirror_is_made_absolute_for_the_chapters(tiny_book: Path, monkeypatch) -> None:
    write_notebook(tiny_book / "book" / "ch_a.ipynb", "import os\nprint(os.environ['MSGCORE_DATA_MIRROR'])")
    monkeypatch.chdir(tiny_book)
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "mirror")
    report = book.run_book(tiny_book, ["ch_a"], "smoke", out=tiny_book / "runs" / "t")
    assert report.ok and str(tiny_book / "mirror") in outputs_text(report.run_dir / "book" / "ch_a.ipynb")


def test_failing_cell_stops_the_run_and_keeps_the_committed_notebook(
        tiny_book: Path, capsys: pytest.CaptureFixture) -> None:
    committed = tiny_book / "book" / "ch_a.ipynb"
    write_notebook(committed, 'raise ValueError("boom")')
    before = committed.read_bytes()
    report = book.run_book(tiny_book, None, "small", out=tiny_book / "runs" / "t", in_place=True)

    assert not report.ok
    assert [(r.chapter, r.status) for r in report.results] == [("ch_a", "FAILED"), ("ch_b", "not run")]
    assert "ValueError: boom" in report.results[0].error
    assert committed.read_bytes() == before
    out = capsys.readouterr().out
    summary = out[out.index("chapter "):]
    assert "ch_a" in summary and "FAILED" in summary and "not run" in summary


def test_strip_injected_parameters_removes_only_that_cell(tiny_book: Path) -> None:
    path = tiny_book / "book" / "ch_a.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(2, new_code_cell('scale = "small"', metadata={"tags": ["injected-parameters", "remove-cell"]}))
    nbformat.write(nb, path)
    assert book.strip_injected_parameters(path) == 1
    cells = nbformat.read(path, as_version=4).cells
    assert len(cells) == 3 and cells[1].metadata.tags == ["parameters", "remove-cell"]
    before = path.read_bytes()
    assert book.strip_injected_parameters(path) == 0 and path.read_bytes() == before


def test_no_committed_notebook_has_an_injected_parameters_cell() -> None:
    for path in sorted((REPO_ROOT / "book").glob("*.ipynb")):
        tags = [c.metadata.get("tags", []) for c in nbformat.read(path, as_version=4).cells]
        assert not any("injected-parameters" in t for t in tags), path.name


def test_progress_line_estimates_what_is_left() -> None:
    done = [book.ChapterResult("a", "small", "ok", 10.0), book.ChapterResult("b", "small", "ok", 20.0)]
    line = book.progress_line(done, 5, "c", "small", 30 * 60)
    assert line == "[3/5] c at small: 30.0 min elapsed, about 45 min left"
    assert "estimate after the first chapter" in book.progress_line([], 5, "a", "small", 0)


def test_main_job_without_a_gpu_builds_the_committed_book_and_checks_one_chapter_live(
        tiny_book: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    built = []

    def fake_build(book_dir: Path) -> Path:
        built.append(book_dir)
        return book_dir / "_build" / "html" / "index.html"
    monkeypatch.setattr(book, "build_book", fake_build)
    monkeypatch.chdir(tiny_book)
    assert book.main_job(tiny_book, gpu=False) == 0
    committed_copy = built[0]
    for name in ("ch_a", "ch_b"):  # the book is built from the committed outputs, not from an execution
        assert (committed_copy / "book" / f"{name}.ipynb").read_bytes() == \
            (tiny_book / "book" / f"{name}.ipynb").read_bytes()
    assert len(built) == 1  # the live check is executed, not built
    out = capsys.readouterr().out
    live_dir = Path(out.split("live check (ch_a at small, ok): ")[1].split("\n")[0])
    assert "scale=small" in outputs_text(live_dir / "book" / "ch_a.ipynb")
    assert str(committed_copy / "_build" / "html" / "index.html") in out
    assert "python -m msgcore.book run --scale" in out and "[1/1] ch_a at small" in out


def test_main_job_with_a_gpu_runs_every_chapter_at_full(tiny_book: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_run_book(root, chapters=None, scale=None, **options):
        calls.append((chapters, scale, options["build"]))
        return book.RunReport(Path(root), [book.ChapterResult("ch_a", scale, "ok", 1.0)])
    monkeypatch.setattr(book, "run_book", fake_run_book)
    assert book.main_job(tiny_book, gpu=True) == 0
    assert calls == [(None, "full", True)]


def test_the_main_command_script_calls_the_main_job() -> None:
    script = (REPO_ROOT / ".ci" / "main").read_text()
    assert "-m msgcore.book main" in script


def test_every_launch_link_and_clone_command_comes_from_repository_url() -> None:
    import re

    import yaml

    config = yaml.safe_load((REPO_ROOT / "_config.yml").read_text())
    url = config["repository"]["url"]
    assert config["parse"]["myst_substitutions"]["repository_url"] == url  # one setting, aliased
    assert "substitution" in config["parse"]["myst_enable_extensions"]
    assert config["launch_buttons"]["colab_url"] and "YOUR-ACCOUNT" in url  # a placeholder a fork must set
    raw = (REPO_ROOT / "_config.yml").read_text()
    assert raw.count("github.com/") == 1  # written once, in repository.url
    intro = (REPO_ROOT / "book" / "intro.md").read_text()
    clones = re.findall(r"git clone[^\n]*", intro)
    assert clones and all("{{ repository_url }}" in c or "$REPO" in c for c in clones)
    assert 'REPO = "{{ repository_url }}"' in intro  # the clone cell's REPO is the setting, which a reader may replace
    texts = [intro, (REPO_ROOT / "README.md").read_text()]
    texts += [p.read_text() for p in (REPO_ROOT / "book").glob("*.ipynb")]
    for text in texts:  # no page or notebook hard-codes a repository or a launch link
        assert not re.findall(r"git clone\s+(?:-q\s+)?https?://", text)
        assert "colab.research.google.com/github" not in text


def test_the_runner_reports_the_runs_each_chapter_reused(tiny_book: Path, capsys: pytest.CaptureFixture) -> None:
    write_notebook(tiny_book / "book" / "ch_a.ipynb",
                   "from msgcore import runcache\nruncache.note_reused('run-abc')\nruncache.note_reused('run-def')")
    report = book.run_book(tiny_book, ["ch_a", "ch_b"], "smoke", out=tiny_book / "runs" / "r")
    assert [r.reused for r in report.results] == [["run-abc", "run-def"], []]
    out = capsys.readouterr().out
    assert "reused 2 cached runs: run-abc, run-def" in out
    assert book.format_summary(report.results).splitlines()[1].split()[-1] == "2"


def test_the_books_stylesheet_wraps_long_output_lines_and_a_build_without_it_is_refused(tmp_path: Path) -> None:
    """Long output lines wrap inside the column (issue seen at 1280 px: findings cut mid-number): the book's
    _static/custom.css holds the rule, every run directory gets it, and a built book that lacks it fails."""
    css = (REPO_ROOT / "_static" / "custom.css").read_text()
    assert book.WRAP_RULE in css and "overflow-x: auto" in css and "div.cell_output pre" in css
    assert REPO_ROOT / "_static" in book.book_sources(REPO_ROOT)
    html = tmp_path / "html"
    (html / "_static").mkdir(parents=True)
    (html / "index.html").write_text("<html></html>")
    (html / "page.html").write_text('<link rel="stylesheet" href="_static/custom.css">')
    with pytest.raises(book.BuildError, match="wrap long output lines"):
        book.check_wrapping(html)  # linked, but the stylesheet is missing
    (html / "_static" / "custom.css").write_text(css)
    book.check_wrapping(html)
    (html / "page.html").write_text("<html>no stylesheet</html>")
    with pytest.raises(book.BuildError, match="wrap long output lines"):
        book.check_wrapping(html)


def test_the_built_book_serves_its_own_mathjax_and_a_build_that_loads_a_cdn_is_refused(tmp_path: Path) -> None:
    import yaml

    assert "sphinx-mathjax-offline" in yaml.safe_load((REPO_ROOT / "_config.yml").read_text())["sphinx"][
        "extra_extensions"]
    html = tmp_path / "html"
    html.mkdir()
    (html / "index.html").write_text('<section class="tex2jax_ignore mathjax_ignore">no equations</section>')
    book.check_offline_math(html)  # no page loads MathJax: nothing to serve
    cdn = '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>'
    (html / "ch01.html").write_text(cdn)
    with pytest.raises(book.BuildError, match="loads MathJax from the network .ch01.html"):
        book.check_offline_math(html)
    (html / "ch01.html").write_text(f'<script defer="defer" src="../{book.LOCAL_MATHJAX}"></script>')
    with pytest.raises(book.BuildError, match="no local copy"):
        book.check_offline_math(html)
    (html / book.LOCAL_MATHJAX).parent.mkdir(parents=True)
    (html / book.LOCAL_MATHJAX).write_text("/* MathJax */")
    book.check_offline_math(html)


def test_a_placeholder_repository_url_builds_no_launch_or_repository_buttons(tiny_book: Path) -> None:
    import yaml

    config = {"title": "tiny", "repository": {"url": "https://github.com/YOUR-ACCOUNT/msgcore-book"},
              "launch_buttons": {"colab_url": "https://colab.research.google.com"},
              "html": {"use_repository_button": True}}
    (tiny_book / "_config.yml").write_text(yaml.safe_dump(config))
    run_dir = book.make_run_dir(tiny_book, "smoke", tiny_book / "runs" / "a")
    copied = yaml.safe_load((run_dir / "_config.yml").read_text())
    assert copied["launch_buttons"]["colab_url"] == "" and copied["html"]["use_repository_button"] is False
    assert copied["repository"] == config["repository"]  # the substitution the intro reads is kept
    config["repository"]["url"] = "https://github.com/someone/msgcore-book"
    (tiny_book / "_config.yml").write_text(yaml.safe_dump(config))
    run_dir = book.make_run_dir(tiny_book, "smoke", tiny_book / "runs" / "b")
    assert yaml.safe_load((run_dir / "_config.yml").read_text()) == config  # a real URL: every button stays


def test_a_full_disk_under_out_is_one_line_naming_the_folder_and_leaves_no_run_folder(tiny_book: Path,
                                                                                   monkeypatch) -> None:
    import errno

    def full(src, dst, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    out, tree = tiny_book / "runs" / "full", book.shutil.copytree
    monkeypatch.setattr(book.shutil, "copytree", lambda *a, **k: tree(*a, **k, copy_function=full))
    with pytest.raises(book.BookError) as caught:  # copytree's shutil.Error lists every file that failed
        book.make_run_dir(tiny_book, "smoke", out)
    files = len(list((tiny_book / "book").iterdir()))
    assert str(caught.value) == f"cannot copy the book into {out}: no space left on device ({files} files not copied)"
    assert not out.exists()
    monkeypatch.setattr(book.shutil, "copy2", full)  # the config, copied on its own: a plain OSError
    with pytest.raises(book.BookError, match=r"^cannot copy the book into .*full: no space left on device$"):
        book.make_run_dir(tiny_book, "smoke", out)
    assert not out.exists()


# ---- progress while a chapter runs ------------------------------------------------------------------------

def test_the_running_cell_is_read_from_papermills_saved_notebook(tmp_path):
    from datetime import datetime, timedelta, timezone

    from msgcore.book import running_cell

    started = (datetime.now(timezone.utc) - timedelta(minutes=3)).isoformat()
    cells = [{"cell_type": "markdown", "source": "# t", "metadata": {}},
             {"cell_type": "code", "source": "x = 1", "metadata": {"papermill": {"status": "completed"}}},
             {"cell_type": "code", "source": "train(model)\nmore", "metadata": {"papermill": {
                 "status": "running", "start_time": started}}},
             {"cell_type": "code", "source": "plot()", "metadata": {"papermill": {"status": "pending"}}}]
    notebook = tmp_path / "nb.ipynb"
    notebook.write_text(json.dumps({"cells": cells}))
    assert running_cell(notebook) == "cell 2 of 3 (`train(model)`) for 3.0 min"  # its first line
    notebook.write_text("{half a file")  # papermill mid-write: nothing to say this time, no error
    assert running_cell(notebook) is None


def test_the_run_in_training_is_the_newest_unfinished_entry(tmp_path):
    import time

    from msgcore.book import run_in_training

    history = [{"kind": "train", "step": 100, "loss": 4.5, "tokens_per_s": 8100.0},
               {"kind": "valid", "step": 100, "valid_bleu": 12.34}, {"kind": "train", "step": 200, "loss": 3.2}]
    for name, finished in (("run-old", True), ("run-new", False)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "log.json").write_text(json.dumps(history))
        if finished:
            (tmp_path / name / "meta.json").write_text("{}")
    assert run_in_training(tmp_path, time.time() - 60) == \
        "training run-new: update 200, loss 3.20, dev BLEU 12.3 at update 100"
    assert run_in_training(tmp_path, time.time() + 60) is None  # nothing changed since the chapter started
    assert run_in_training(None, 0.0) is None


def test_the_live_check_says_plainly_whether_it_trained_or_reused():
    trained = book.RunReport(Path("r"), [book.ChapterResult("ch00", "small", "ok", 20.0)])
    reused = book.RunReport(Path("r"), [book.ChapterResult("ch00", "small", "ok", 1.2, reused=["run-a", "run-b"])])
    assert book.live_check_note(trained) == "it trained every run it needed on this machine"
    assert book.live_check_note(reused).startswith("it reused 2 runs from the run cache (trained nothing")


# ---- what each chapter cost ---------------------------------------------------------------------------------

def test_an_execution_records_its_cost_and_the_reused_runs_commits_and_the_book_reads_it_back(tiny_book, tmp_path,
                                                                                               monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MSGCORE_RUNS", str(cache))
    for name, meta in (("run-aaa", {"commit": "abc1234", "date": "d", "device": "cpu", "wall_time_s": 600.0}),
                       ("natcurve-bbb", {"commit": "def5678", "date": "d", "kind": "natcurve"})):
        (cache / name).mkdir(parents=True)
        (cache / name / "meta.json").write_text(json.dumps({"files": {}, **meta}))
    path = tiny_book / "book" / "ch_a.ipynb"
    cost = book.record_cost(path, book.ChapterResult("ch_a", "small", "ok", 30.0, reused=["run-aaa"]))
    assert cost["cold minutes"] == 40.0 and not cost["cold is a lower bound"] and cost["built"] == []
    assert nbformat.read(path, as_version=4).metadata["msgcore"]["cost"]["reused"][0]["trained at commit"] == "abc1234"
    book.record_cost(tiny_book / "book" / "ch_b.ipynb",
                     book.ChapterResult("ch_b", "small", "ok", 6.0, reused=["run-aaa", "natcurve-bbb"]))
    table = book.chapter_costs(tiny_book).set_index("chapter")
    assert table.loc["ch_a", "cold minutes"] == 40.0 and table.loc["ch_a", "device"] == cost["device"]
    assert table.loc["ch_b", "cold minutes"] == "≥ 16.0"  # the curve artefact has no minutes on record
    trained = book.record_cost(path, book.ChapterResult("ch_a", "small", "ok", 30.0, built=["run-aaa"]))
    assert trained["cold minutes"] == 30.0  # a run trained in the execution is inside its minutes, counted once
    assert [row["entry"] for row in trained["built"]] == ["run-aaa"] and trained["reused"] == []
    (cache / "run-ccc").mkdir()  # trained on 1 of 2 cores beside another process: half of its 10 minutes
    (cache / "run-ccc" / "meta.json").write_text(json.dumps({"files": {}, "device": "cpu", "wall_time_s": 600.0,
                                                             "cpu threads": 1, "cpu cores": 2}))
    shared = book.record_cost(path, book.ChapterResult("ch_a", "small", "ok", 30.0, reused=["run-aaa", "run-ccc"]))
    assert shared["cold minutes"] == 45.0 and shared["reused"][1]["minutes"] == 10.0
    write_notebook(path, "print(1)")  # executed before costs were recorded: its duration alone, if any
    row = book.chapter_costs(tiny_book).set_index("chapter").loc["ch_a"]
    assert row["reused runs"] == row["cold minutes"] == "not recorded" and not row.isna().any()


def test_a_chapter_whose_results_are_stale_opens_with_a_warning_and_a_current_one_does_not(tmp_path: Path) -> None:
    from msgcore import chapters, verdicts

    (tmp_path / "book" / "results").mkdir(parents=True)
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n"
                                       "  - file: book/ch00_transformer_baseline\n  - file: book/ch05_coverage_nat\n")
    for name in ("ch00_transformer_baseline", "ch05_coverage_nat"):
        write_notebook(tmp_path / "book" / f"{name}.ipynb", "print(1)")
    current = chapters.identity("ch00_transformer_baseline", "small")
    verdicts.write_results(tmp_path / "book" / "results" / "ch00_transformer_baseline.json", "0", "small", "abc", [],
                           {}, current)
    older = {**chapters.identity("ch05_coverage_nat", "small"), "recipe": "0" * 16}
    verdicts.write_results(tmp_path / "book" / "results" / "ch05_coverage_nat.json", "5", "small", "def", [], {},
                           older)
    assert book.mark_stale_chapters(tmp_path) == ["ch05_coverage_nat"]
    stale = nbformat.read(tmp_path / "book" / "ch05_coverage_nat.ipynb", as_version=4)
    assert stale.cells[0].source == "# ch05_coverage_nat" and book.STALE_TAG in stale.cells[1].metadata["tags"]
    assert "These results are stale" in stale.cells[1].source and "commit def" in stale.cells[1].source
    assert "its `small` recipe changed since" in stale.cells[1].source
    fresh = nbformat.read(tmp_path / "book" / "ch00_transformer_baseline.ipynb", as_version=4)
    assert not any(book.STALE_TAG in c.metadata.get("tags", []) for c in fresh.cells)
    assert book.mark_stale_chapters(tmp_path) == ["ch05_coverage_nat"]  # marking twice leaves one warning
    again = nbformat.read(tmp_path / "book" / "ch05_coverage_nat.ipynb", as_version=4)
    assert sum(book.STALE_TAG in c.metadata.get("tags", []) for c in again.cells) == 1


def test_a_chapter_executed_on_a_gpu_is_never_silently_replaced_by_a_cpu_execution(tiny_book: Path) -> None:
    committed = tiny_book / "book" / "ch_b.ipynb"
    nb = nbformat.read(committed, as_version=4)
    nb.metadata["msgcore"] = {"cost": {"device type": "cuda", "device": "NVIDIA H100 80GB HBM3"}}
    nbformat.write(nb, committed)
    before = committed.read_bytes()
    with pytest.raises(book.BookError, match="ch_b was executed on a GPU \\(NVIDIA H100 80GB HBM3\\); a CPU "
                                             "execution would replace it: pass --replace-gpu-results"):
        book.run_book(tiny_book, ["ch_b"], "small", out=tiny_book / "runs" / "t", in_place=True, device="cpu")
    assert committed.read_bytes() == before and not (tiny_book / "runs" / "t").exists()  # refused before any work
    assert book.run_book(tiny_book, ["ch_b"], "small", out=tiny_book / "runs" / "u", device="cpu").ok  # not in place
    report = book.run_book(tiny_book, ["ch_b"], "small", out=tiny_book / "runs" / "v", in_place=True, device="cpu",
                           replace_gpu_results=True)
    cost = nbformat.read(committed, as_version=4).metadata["msgcore"]["cost"]
    assert report.ok and cost["device type"] == "cpu"  # the execution records where it ran


def test_a_chapter_that_reads_an_entry_twice_counts_it_once(tmp_path):
    log = tmp_path / "ch.reused.txt"
    log.write_text("run-a\nrun-b\nrun-a\nrun-c\nrun-b\n")
    assert book.reused_entries(log) == ["run-a", "run-b", "run-c"]
    assert book.reused_entries(tmp_path / "absent.txt") == []
