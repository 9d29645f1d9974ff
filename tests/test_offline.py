"""The offline GPU path (msgcore.offline): stage, run, unpack, each refusal on its own, and the whole path as a
capped dry run on the CPU."""
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from msgcore import offline
from msgcore.utils import MsgcoreError

REPO_ROOT = Path(__file__).resolve().parent.parent


def archive_of(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


RESULTS = json.dumps({"chapter": "0", "scale": "small", "commit": "abc", "claims": [], "systems": []}).encode()


@pytest.mark.parametrize("name", ["book/../README.md", "/etc/passwd", "msgcore/verdicts.py", "book/ch00.ipynb.pt",
                                  "book/logs/run-1/best.pt", "book/results/../../x.json", "book/logs/a/b/log.json"])
def test_unpack_refuses_anything_but_evidence_under_book_before_writing(tmp_path, name):
    archive = archive_of(tmp_path / "e.tar.gz", {"book/results/ch00_transformer_baseline.json": RESULTS,
                                                 name: b"{}"})
    with pytest.raises(MsgcoreError, match="refused"):
        offline.unpack(archive, tmp_path / "home")
    assert not (tmp_path / "home").exists()  # nothing written


def test_unpack_refuses_links_and_unreadable_json(tmp_path):
    links = archive_of(tmp_path / "l.tar.gz", {}, {"book/results/ch00_transformer_baseline.json": "/etc/passwd"})
    with pytest.raises(MsgcoreError, match="not a plain file"):
        offline.unpack(links, tmp_path / "home")
    broken = archive_of(tmp_path / "b.tar.gz", {"book/results/ch00_transformer_baseline.json": b"{not json"})
    with pytest.raises(MsgcoreError, match="not readable JSON"):
        offline.unpack(broken, tmp_path / "home")
    (tmp_path / "x.tar.gz").write_bytes(b"garbage")
    with pytest.raises(MsgcoreError, match="not a readable evidence archive"):
        offline.unpack(tmp_path / "x.tar.gz", tmp_path / "home")


def test_unpack_writes_the_evidence_and_regenerates_readme(tmp_path):
    from msgcore import scoreboard

    home = tmp_path / "home"
    (home / "book" / "results").mkdir(parents=True)
    (home / "README.md").write_text(f"# t\n{scoreboard.START}\nold\n{scoreboard.END}\n")
    archive = archive_of(tmp_path / "e.tar.gz", {"book/results/ch00_transformer_baseline.json": RESULTS,
                                                 "book/logs/run-abc/log.json": b"[]"})
    names = offline.unpack(archive, home)
    assert names == ["book/results/ch00_transformer_baseline.json", "book/logs/run-abc/log.json"]
    assert (home / "book" / "logs" / "run-abc" / "log.json").read_text() == "[]"
    assert "old" not in (home / "README.md").read_text() and "| 0 | small | abc |" in (home / "README.md").read_text()


def fake_wheel(folder: Path, name: str = "tinypkg", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel: one module and its dist-info."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}.py", "ANSWER = 42\n")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_the_bundles_wheels_install_offline_into_a_folder_of_their_own(tmp_path):
    fake_wheel(tmp_path / "bundle" / "wheels")
    assert offline.install_wheels(tmp_path / "bundle", tmp_path / "site")
    assert (tmp_path / "site" / "tinypkg.py").read_text() == "ANSWER = 42\n"
    assert not offline.install_wheels(tmp_path / "empty", tmp_path / "site2")  # no wheels: nothing to install


def test_stage_copies_the_data_and_the_commit_and_refuses_a_mirror_without_the_data(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    for name in offline.DATA_SETS:
        (mirror / name).mkdir(parents=True)
        (mirror / name / "f.txt").write_text(name)
    monkeypatch.setenv("MSGCORE_COMMIT", "1234abc")
    size = offline.stage(tmp_path / "bundle", mirror, with_wheels=False)
    assert (tmp_path / "bundle" / "COMMIT").read_text() == "1234abc\n"
    assert (tmp_path / "bundle" / "data" / "multi30k" / "f.txt").read_text() == "multi30k"
    assert size == offline.folder_size(tmp_path / "bundle")
    (mirror / "multi30k-task2" / "f.txt").unlink()
    (mirror / "multi30k-task2").rmdir()
    with pytest.raises(MsgcoreError, match="lacks multi30k-task2"):
        offline.stage(tmp_path / "bundle2", mirror, with_wheels=False)
    assert not (tmp_path / "bundle2").exists()


def test_the_pinned_wheels_are_the_closure_papermill_needs_beyond_the_image():
    assert {"papermill", "nbclient", "nbformat", "ipykernel", "jupyter_client", "pyzmq", "tornado"} <= set(offline.WHEELS)
    assert not {"torch", "numpy", "pandas", "pyyaml", "requests", "debugpy", "jedi"} & set(offline.WHEELS)


def test_pack_takes_notebooks_results_and_logs_never_a_checkpoint(tmp_path):
    import os
    import time

    work, cache = tmp_path / "work", tmp_path / "cache"
    book = work / "run" / "ch05_coverage_nat" / "book"
    (book / "results").mkdir(parents=True)
    (book / "ch05_coverage_nat.ipynb").write_text("{}")
    (book / "ch01_trice.ipynb").write_text("{}")  # a copy of a chapter that did not run here
    (book / "results" / "ch05_coverage_nat.json").write_text("{}")
    (work / "probe" / "book" / "benchmarks" / "probe").mkdir(parents=True)
    for name in ("nvidia-h100.json", "nvidia-h100.md"):
        (work / "probe" / "book" / "benchmarks" / "probe" / name).write_text("{}")
    for entry in (cache / "run-abc", cache / "capped-u2-s24" / "run-dry"):  # a dry run's entries, under its caps
        entry.mkdir(parents=True)
        for name in ("log.json", "meta.json", "best.pt", "last.pt"):
            (entry / name).write_text("{}")
    unfinished = cache / "natcurve-0123456789abcdef" / "work"  # cut off at the deadline: no meta.json yet
    unfinished.mkdir(parents=True)
    for name in ("log.json", "last.pt"):
        (unfinished / name).write_text("[]")
    archive = offline.pack(tmp_path / "e.tar.gz", work, cache, ["ch05_coverage_nat"], probe=True)
    logs = ["book/logs/natcurve-0123456789abcdef/partial-log.json", "book/logs/run-abc/log.json",
            "book/logs/run-abc/meta.json", "book/logs/run-dry/log.json", "book/logs/run-dry/meta.json"]
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["book/benchmarks/probe/nvidia-h100.json",
                                          "book/benchmarks/probe/nvidia-h100.md", "book/ch05_coverage_nat.ipynb",
                                          *logs, "book/results/ch05_coverage_nat.json"]
    assert offline.checked_members(archive)  # what run packs, unpack takes
    without_probe = offline.pack(tmp_path / "f.tar.gz", work, cache, ["ch05_coverage_nat"])
    with tarfile.open(without_probe) as tar:  # the book's own probe reports are not this run's evidence
        assert not [name for name in tar.getnames() if "probe" in name]
    old = time.time() - 3600  # the book's own copy of a results file, never rewritten by this run's notebook
    os.utime(book / "results" / "ch05_coverage_nat.json", (old, old))
    fresh_only = offline.pack(tmp_path / "g.tar.gz", work, cache, ["ch05_coverage_nat"], since=time.time() - 60)
    with tarfile.open(fresh_only) as tar:
        assert "book/ch05_coverage_nat.ipynb" in tar.getnames()
        assert "book/results/ch05_coverage_nat.json" not in tar.getnames()


def notebook(*counts) -> bytes:
    return json.dumps({"cells": [{"cell_type": "markdown", "source": "# t"}] +
                      [{"cell_type": "code", "source": "x = 1", "execution_count": c} for c in counts]}).encode()


def test_unpack_leaves_the_page_alone_when_the_notebook_was_cut_off(tmp_path, capsys):
    home = tmp_path / "home"
    (home / "book").mkdir(parents=True)
    (home / "book" / "ch00_transformer_baseline.ipynb").write_bytes(notebook(1, 2))
    archive = archive_of(tmp_path / "e.tar.gz", {"book/ch00_transformer_baseline.ipynb": notebook(1, None),
                                                 "book/ch05_coverage_nat.ipynb": notebook(1, 2),
                                                 "book/logs/run-abc/log.json": b"[]"})
    names = offline.unpack(archive, home)
    assert names == ["book/ch05_coverage_nat.ipynb", "book/logs/run-abc/log.json"]
    assert (home / "book" / "ch00_transformer_baseline.ipynb").read_bytes() == notebook(1, 2)
    assert "skipped book/ch00_transformer_baseline.ipynb: cut off" in capsys.readouterr().err


def test_parallel_steps_each_get_their_own_minutes_and_a_chatty_one_never_stalls(tmp_path):
    import sys
    import time

    chatty = [sys.executable, "-c", "import sys; sys.stdout.write('x' * 10 ** 6); print(); print('done')"]
    quick = offline.Step("quick", [sys.executable, "-c", "print('ok')"])
    slow = offline.Step("slow", [sys.executable, "-c", "import time; time.sleep(60)"])
    steps = offline.run_parallel([offline.Step("chatty", chatty), quick, slow], {}, time.monotonic() + 8,
                                 tmp_path / "outputs")
    assert [s.returncode for s in steps[:2]] == [0, 0] and steps[0].tail[-1] == "done"
    assert slow.timed_out and not quick.timed_out
    assert quick.minutes < slow.minutes / 2  # measured when it exited, not when the slowest was reaped


def test_a_chapter_is_executed_as_soon_as_its_own_runs_are_done(tmp_path, monkeypatch):
    """One pipeline per chapter, all at once: a chapter's notebook starts when its shares finish, while another
    chapter's shares still train."""
    import threading
    import time

    events, lock = [], threading.Lock()

    def note(what):
        with lock:
            events.append(what)

    def fake_parallel(steps, env, deadline, logs):
        time.sleep(0.1 if "ch00" in steps[0].name else 1.0)
        note(f"shares of {steps[0].name.split()[0]} done")
        for step in steps:
            step.returncode = 0
        return steps

    def fake_step(step, env, deadline):
        note(f"notebook {step.name.split()[0]}")
        step.returncode = 0
        return step

    monkeypatch.setattr(offline, "run_parallel", fake_parallel)
    monkeypatch.setattr(offline, "run_step", fake_step)
    monkeypatch.setattr(offline, "supports_parts", lambda chapter: True)
    monkeypatch.setattr(offline, "install_wheels", lambda bundle, site: False)
    monkeypatch.setattr(offline, "device_report", lambda: "no device")
    _, failed = offline.run(tmp_path / "out", ["ch00_transformer_baseline", "ch05_coverage_nat"], "small", "cpu",
                            tmp_path / "bundle", parts=3, smoke=False, cache=tmp_path / "cache")
    assert failed == []
    assert events == ["shares of ch00_transformer_baseline done", "notebook ch00_transformer_baseline",
                      "shares of ch05_coverage_nat done", "notebook ch05_coverage_nat"]


def test_a_step_past_the_deadline_is_killed_and_says_so(tmp_path):
    import sys
    import time

    step = offline.run_step(offline.Step("sleeper", [sys.executable, "-c", "import time; print('hi'); time.sleep(60)"]),
                            {}, time.monotonic() + 6)
    assert step.timed_out and step.minutes < 0.5
    late = offline.run_step(offline.Step("late", ["true"]), {}, time.monotonic() + 1)
    assert late.returncode is None  # not started: no time left


def test_a_second_command_finds_the_runs_the_first_left_in_its_cache(tmp_path, monkeypatch):
    """The run cache outlives one `run` (a warm GPU machine takes a second command): each command's processes see
    the same MSGCORE_RUNS, and the second's evidence carries the runs the first finished."""
    seen = []

    def fake_step(step, env, deadline):
        seen.append(env["MSGCORE_RUNS"])
        entry = Path(env["MSGCORE_RUNS"]) / f"run-{len(seen)}"
        entry.mkdir()
        (entry / "log.json").write_text("[]")
        (entry / "meta.json").write_text("{}")
        step.returncode, step.minutes = 0, 0.0
        return step

    monkeypatch.setattr(offline, "run_step", fake_step)
    monkeypatch.setattr(offline, "install_wheels", lambda bundle, site: False)
    monkeypatch.setattr(offline, "device_report", lambda: "no device")
    cache = tmp_path / "cache"
    for i in (1, 2):
        archive, failed = offline.run(tmp_path / f"out{i}", ["ch00_transformer_baseline"], "small", "cpu",
                                      tmp_path / "bundle", parts=1, smoke=False, cache=cache)
        assert failed == []
    assert seen == [str(cache.resolve())] * 2
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["book/logs/run-1/log.json", "book/logs/run-1/meta.json",
                                          "book/logs/run-2/log.json", "book/logs/run-2/meta.json"]


def test_a_chapter_that_fails_makes_the_command_fail_after_packing_its_evidence(tmp_path, monkeypatch):
    def failing(step, env, deadline):
        step.returncode, step.minutes = 1, 0.1
        return step

    monkeypatch.setattr(offline, "run_step", failing)
    monkeypatch.setattr(offline, "install_wheels", lambda bundle, site: False)
    monkeypatch.setattr(offline, "device_report", lambda: "no device")
    code = offline.main(["run", "--out", str(tmp_path / "out"), "--chapter", "ch00_transformer_baseline",
                         "--device", "cpu", "--bundle", str(tmp_path / "bundle"), "--cache", str(tmp_path / "cache"),
                         "--parts", "1", "--no-smoke"])
    assert code == 1 and (tmp_path / "out" / "evidence.tar.gz").is_file()
    assert "exit 1" in (tmp_path / "out" / "summary.txt").read_text()


def test_parts_are_one_number_for_every_chapter_or_one_per_chapter(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_pipeline(chapter, scale, device, seed, parts, *rest):
        seen[chapter] = parts
        return []

    monkeypatch.setattr(offline, "chapter_pipeline", fake_pipeline)
    monkeypatch.setattr(offline, "install_wheels", lambda bundle, site: False)
    monkeypatch.setattr(offline, "device_report", lambda: "no device")
    common = ["run", "--out", str(tmp_path / "out"), "--device", "cpu", "--bundle", str(tmp_path / "bundle"),
              "--cache", str(tmp_path / "cache"), "--no-smoke", "--chapter", "ch00_transformer_baseline",
              "ch05_coverage_nat"]
    assert offline.main([*common, "--parts", "3", "12"]) == 0
    assert seen == {"ch00_transformer_baseline": 3, "ch05_coverage_nat": 12}
    assert offline.main([*common, "--parts", "6"]) == 0
    assert seen == {"ch00_transformer_baseline": 6, "ch05_coverage_nat": 6}
    assert offline.main([*common, "--parts", "3", "4", "5"]) == 2
    assert "one per chapter (2), not 3 4 5" in capsys.readouterr().err
    late = ["--out", str(tmp_path / "late")]
    assert offline.main([*common, *late, "--deadline-min", "2", "--notebook-min", "2"]) == 2  # no time to train
    assert "below --deadline-min 2" in capsys.readouterr().err and not (tmp_path / "late").exists()


def test_report_tells_each_runs_cost_finished_or_cut_off(tmp_path):
    train = lambda step, speed: {"kind": "train", "step": step, "epoch": 1, "tokens_per_s": speed}  # noqa: E731
    valid = lambda step, bleu: {"kind": "valid", "step": step, "epoch": 1, "valid_bleu": bleu}  # noqa: E731
    done, cut = tmp_path / "run-aaaaaaaaaaaaaaaa", tmp_path / "natcurve-bbbbbbbbbbbbbbbb"
    done.mkdir()
    cut.mkdir()
    (done / "log.json").write_text(json.dumps([train(50, 100.0), valid(100, 20.0), train(150, 300.0),
                                               valid(200, 19.0)]))
    (done / "meta.json").write_text(json.dumps({"wall_time_s": 60.0, "device": "cuda", "commit": "abc"}))
    (cut / "partial-log.json").write_text(json.dumps([train(50, 10.0), valid(100, 5.0)]))
    (tmp_path / "distilled-cccccccccccccccc").mkdir()  # no training log: not a row
    table = offline.report(tmp_path).splitlines()
    assert len(table) == 4
    assert "| run-aaaaaaaaaaaaaaaa | finished | cuda | abc | 200 | 1 | 1.0 | 300 | 300 | 20.00 at 100 |" in table
    assert "| natcurve-bbbbbbbbbbbbbbbb | cut off | – | – | 100 | 1 | – | – | 10 | 5.00 at 100 |" in table
    with pytest.raises(MsgcoreError, match="holds no training run's log"):
        offline.report(tmp_path / "distilled-cccccccccccccccc")
    (tmp_path / "run-dddddddddddddddd").mkdir()
    (tmp_path / "run-dddddddddddddddd" / "log.json").write_text('[{"kind": "train"}]')  # no step: not a log
    with pytest.raises(MsgcoreError, match="run-dddddddddddddddd holds no readable training log"):
        offline.report(tmp_path)
