"""Hostile files and faults beyond the command line's options: checkpoints and archives that would run code or
escape the cache, damaged or diverged weights, device nodes as outputs, full disks, garbage states.

Each case is one line "error: ..." (exit status 2) or the documented recovery, and leaves no partial file;
tests/README.md tabulates them. Training here is tiny (synthetic corpus, `tiny` preset, a few dozen steps).
"""
from __future__ import annotations

import contextlib
import io
import os
import stat
import subprocess
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest
import torch

from msgcore import book, bench, bench_peers, download, runcache
from msgcore.__main__ import main
from msgcore.experiments import __main__ as experiments_script
from msgcore.trainer import CHECKPOINT_KEYS, load_checkpoint, weights_sha256
from msgcore.utils import MsgcoreError
from test_cli_errors import copy_run, files, one_line_error, private_cache, run, train_args  # noqa: F401 (fixtures)


class RunsCode:
    """Unpickling this calls open(marker, "w"): it stands for any code a crafted pickle could run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def translate_args(checkpoint: Path, tmp_path: Path, output: Path | None = None) -> list[str]:
    src = tmp_path / "in.xa"
    src.write_text("x y z\n")
    return ["translate", "--checkpoint", str(checkpoint), "--input", str(src), "--output",
            str(output or tmp_path / "hyp"), "--device", "cpu", "--beam", "1"]


@contextlib.contextmanager
def full_disk(tmp_path: Path):
    """A 64 KiB tmpfs filled to the last byte (a real ENOSPC, not a mock); skipped where mount is not allowed."""
    mount = tmp_path / "full"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        with contextlib.suppress(OSError), open(mount / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# ---------------------------------------------------------------------------- 1-2: nothing loaded may run code

@pytest.mark.parametrize("command", ["translate", "train --resume"])
def test_a_checkpoint_that_would_run_code_is_refused(run, files, tmp_path, capsys, command):
    marker = tmp_path / "marker"
    crafted = load_checkpoint(run / "last.pt")
    crafted["rng"] = RunsCode(marker)  # every other key is a real checkpoint's
    torch.save(crafted, tmp_path / "last.pt")
    args = translate_args(tmp_path / "last.pt", tmp_path) if command == "translate" else \
        train_args(files, tmp_path / "o", "--resume", str(tmp_path / "last.pt"))
    assert main(args) == 2
    one_line_error(capsys, "could run code")
    assert not marker.exists()


def test_a_cached_artefact_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "marker"
    key = {"what": "a crafted entry"}
    entry = runcache.artifact_entry("distilled", key)
    entry.mkdir(parents=True)
    torch.save({"targets": RunsCode(marker)}, entry / "artifact.pt")
    runcache.mark_finished(entry, ["artifact.pt"], kind="distilled")  # its checksum matches: only the content is bad
    with pytest.raises(MsgcoreError, match="could run code"):
        runcache.cached_artifact("distilled", key, lambda: pytest.fail("rebuilt"))
    assert not marker.exists()


def test_no_loader_in_msgcore_unpickles_arbitrary_objects():
    package = Path(__file__).resolve().parent.parent / "msgcore"
    offending = [f"{path.name}:{n}" for path in package.rglob("*.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1) if "weights_only=False" in line]
    assert offending == []


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x", link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, io.BytesIO(data) if kind == tarfile.REGTYPE else None


HOSTILE_MEMBERS = {
    "path traversal": ([member("run-a/best.pt"), member("../escaped.txt")], "leaves the run cache"),
    "traversal inside an entry": ([member("run-a/../../escaped.txt")], "leaves the run cache"),
    "absolute path": ([member("/tmp/msgcore-absolute.txt")], "absolute path"),
    "symbolic link": ([member("run-a/best.pt", tarfile.SYMTYPE, link="/etc/passwd")], "is a link"),
    "hard link": ([member("run-a/best.pt", tarfile.LNKTYPE, link="run-b/x")], "is a link"),
    "character device": ([member("run-a/null", tarfile.CHRTYPE)], "device or special file"),
    "FIFO": ([member("run-a/pipe", tarfile.FIFOTYPE)], "device or special file"),
}


@pytest.mark.parametrize("case", HOSTILE_MEMBERS)
def test_a_hostile_archive_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, case):
    members, words = HOSTILE_MEMBERS[case]
    archive = tmp_path / "cache.tar"
    with tarfile.open(archive, "w") as tar:
        for info, data in members:
            tar.addfile(info, data)
    root = tmp_path / "runs"
    monkeypatch.setenv("MSGCORE_RUNS", str(root))
    assert experiments_script.main(["--unpack", str(archive)]) == 2
    one_line_error(capsys, "refused", words)
    assert not root.exists() or list(root.iterdir()) == []
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/msgcore-absolute.txt").exists()


def packed_cache(tmp_path: Path, monkeypatch) -> Path:
    """A real packed cache: two finished artefact entries."""
    for n in range(2):
        runcache.cached_artifact("toy", {"n": n}, lambda: {"ids": torch.arange(20_000)})
    archive = tmp_path / "cache.tar"
    assert experiments_script.main(["--pack", str(archive)]) == 0
    return archive


@pytest.mark.parametrize("damage, words", [
    ("not a tar", ["not a readable tar archive"]),
    ("truncated", ["--unpack"]),
    ("a checksum fails", ["fail their checksums"]),
])
def test_a_damaged_archive_unpacks_nothing(tmp_path, capsys, monkeypatch, damage, words):
    archive = packed_cache(tmp_path, monkeypatch)
    data = archive.read_bytes()
    if damage == "not a tar":
        archive.write_bytes(b"this is not a tar archive\n" * 100)
    elif damage == "truncated":
        archive.write_bytes(data[: len(data) // 2])
    else:
        with tarfile.open(archive) as tar, tarfile.open(tmp_path / "edited.tar", "w") as edited:
            for info in tar.getmembers():
                content = tar.extractfile(info).read() if info.isfile() else None
                if info.name.endswith("artifact.pt") and content:
                    content = content[:-100] + bytes(100)  # same size, other bytes
                edited.addfile(info, io.BytesIO(content) if content is not None else None)
        archive = tmp_path / "edited.tar"
    root = tmp_path / "elsewhere"
    monkeypatch.setenv("MSGCORE_RUNS", str(root))
    assert experiments_script.main(["--unpack", str(archive)]) == 2
    one_line_error(capsys, *words)
    assert not root.exists() or list(root.iterdir()) == []


def test_unpack_keeps_entries_already_there(tmp_path, capsys, monkeypatch):
    archive = packed_cache(tmp_path, monkeypatch)
    assert experiments_script.main(["--unpack", str(archive)]) == 0  # into the same cache
    assert "0 new entries, 2 already there" in capsys.readouterr().out
    assert not [p for p in Path(os.environ["MSGCORE_RUNS"]).iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------------------- 3: damaged and diverged weights

def flip_tensor_bytes(path: Path, count: int = 64) -> None:
    """Flip `count` bytes in the middle of every tensor record of a torch zip checkpoint (stored, uncompressed)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if "/data/" in info.filename and info.file_size >= 4 * count:
                name_len, extra_len = int.from_bytes(data[info.header_offset + 26: info.header_offset + 28], "little"), \
                    int.from_bytes(data[info.header_offset + 28: info.header_offset + 30], "little")
                start = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
                data[start: start + count] = bytes(b ^ 0xFF for b in data[start: start + count])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, words", [
    ("64 flipped bytes", ["damaged", "SHA-256"]),
    ("every weight NaN", ["NaN/inf weights", "diverged"]),
    ("one weight inf", ["NaN/inf weights"]),
])
def test_damaged_or_diverged_weights_are_refused(run, tmp_path, capsys, damage, words):
    bad = tmp_path / "best.pt"
    if damage == "64 flipped bytes":
        bad.write_bytes((run / "best.pt").read_bytes())
        flip_tensor_bytes(bad)
    else:
        checkpoint = load_checkpoint(run / "best.pt")
        for name, tensor in checkpoint["model"].items():
            if tensor.is_floating_point():
                tensor.fill_(float("nan")) if damage == "every weight NaN" else tensor.view(-1)[0].fill_(float("inf"))
        checkpoint["weights_sha256"] = weights_sha256(checkpoint["model"])  # consistent: only the values are bad
        torch.save(checkpoint, bad)
    assert main(translate_args(bad, tmp_path)) == 2
    one_line_error(capsys, *words)
    assert not (tmp_path / "hyp").exists()


def test_every_checkpoint_carries_the_sha256_of_its_weights(run):
    checkpoint = load_checkpoint(run / "best.pt")
    assert "weights_sha256" in CHECKPOINT_KEYS
    assert checkpoint["weights_sha256"] == weights_sha256(checkpoint["model"])


# ---------------------------------------------------------------------------- 4: outputs that are not files

def test_translate_into_a_character_device_keeps_the_device(run, tmp_path):
    node = tmp_path / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a second /dev/null: root may make one anywhere
    assert main(translate_args(run / "best.pt", tmp_path, node)) == 0
    assert stat.S_ISCHR(node.stat().st_mode)


def test_translate_into_a_pipe_writes_through_it(run, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    try:
        assert main(translate_args(run / "best.pt", tmp_path, fifo)) == 0
        reader.join(timeout=60)
    finally:
        if reader.is_alive():  # nothing wrote into the pipe: open it once so that the reader ends
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert stat.S_ISFIFO(fifo.stat().st_mode) and len(received[0].splitlines()) == 1


def test_translate_into_a_link_replaces_its_target_and_keeps_the_link(run, tmp_path):
    target, link = tmp_path / "real.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    link.symlink_to(target)
    assert main(translate_args(run / "best.pt", tmp_path, link)) == 0
    assert link.is_symlink() and target.read_text() != "old\n" and len(target.read_text().splitlines()) == 1


# ---------------------------------------------------------------------------- 5-7, 10: resume

def test_resume_refuses_other_validation_files(run, files, tmp_path, capsys):
    from test_cli_errors import write_corpus

    out = copy_run(run, tmp_path / "r")
    other = write_corpus(tmp_path / "other", 20, seed=7, split="val")
    args = train_args(files, out, "--resume", str(out / "last.pt"))
    at = args.index("--valid-files") + 1
    args[at: at + 2] = other
    assert main(args) == 2
    one_line_error(capsys, "other validation data", "--valid-files")


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_best_pt_beside_a_sound_last_pt_is_replaced_by_a_validation(run, files, tmp_path, capsys, damage):
    out = copy_run(run, tmp_path / "r")
    if damage == "corrupt":
        (out / "best.pt").write_bytes((out / "best.pt").read_bytes()[:1000])
    else:
        (out / "best.pt").unlink()
    step = load_checkpoint(out / "last.pt")["state"]["step"]
    assert main(train_args(files, out, "--max-steps", str(step), "--resume", str(out / "last.pt"))) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "best.pt" in err and "validates it now" in err
    assert load_checkpoint(out / "best.pt")["state"]["best_step"] == step


def test_resume_removes_the_temporaries_a_killed_save_left(run, files, tmp_path):
    out = copy_run(run, tmp_path / "r")
    stale = [out / ".last.pt.k1ll3d.tmp", out / ".best.pt.x9.tmp", out / ".log.json.a1.tmp"]
    for path in stale:
        path.write_bytes(b"half a checkpoint")
    (out / "notes.tmp").write_text("not ours")
    assert main(train_args(files, out, "--max-steps", "21", "--resume", str(out / "last.pt"))) == 0
    assert not any(path.exists() for path in stale) and (out / "notes.tmp").exists()


@pytest.mark.parametrize("field, garbage", [
    ("state", {"step": "twenty"}), ("state", {"history": 5}), ("state", {"step": -3}),
    ("rng", {"torch": "garbage"}), ("rng", {"numpy": [1, 2]}), ("rng", {"python": None}),
])
def test_resume_from_a_garbage_trainer_or_rng_state_is_one_line(run, files, tmp_path, capsys, field, garbage):
    out = copy_run(run, tmp_path / "r")
    checkpoint = load_checkpoint(out / "last.pt")
    checkpoint[field] = {**checkpoint[field], **garbage}
    torch.save(checkpoint, out / "last.pt")
    assert main(train_args(files, out, "--max-steps", "22", "--resume", str(out / "last.pt"))) == 2
    one_line_error(capsys, "trainer or RNG state is unreadable")


# ---------------------------------------------------------------------------- 8: seeds and devices, every command

BAD_DEVICES = ["mps", "meta", "bogus", "cuda:7"]


@pytest.mark.parametrize("device", BAD_DEVICES)
@pytest.mark.parametrize("command", ["train", "translate", "bench", "experiments", "book"])
def test_a_device_this_machine_lacks_is_refused_up_front(tmp_path, capsys, monkeypatch, command, device):
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    run_command = {
        "train": lambda: main(["train", "--dataset", "synthetic", "--out", str(tmp_path / "o"), "--device", device]),
        "translate": lambda: main(["translate", "--checkpoint", "c.pt", "--input", "i", "--output",
                                   str(tmp_path / "o"), "--device", device]),
        "bench": lambda: bench.main(["--skip-hf", "--out", str(tmp_path / "o"), "--device", device]),
        "experiments": lambda: experiments_script.main(["ch00", "--out", str(tmp_path / "o"), "--device", device]),
        "book": lambda: book.main(["run", "--chapter", "none", "--out", str(tmp_path / "o"), "--device", device]),
    }[command]
    assert run_command() == 2
    err = capsys.readouterr().err
    assert "error: " in err and device in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("seed", ["-1", "4294967296", "99999999999999999999"])
@pytest.mark.parametrize("command", ["train", "experiments", "book"])
def test_a_seed_outside_32_bits_is_refused_up_front(tmp_path, capsys, command, seed):
    run_command = {
        "train": lambda: main(["train", "--dataset", "synthetic", "--out", str(tmp_path / "o"), "--seed", seed]),
        "experiments": lambda: experiments_script.main(["ch00", "--out", str(tmp_path / "o"), "--seed", seed]),
        "book": lambda: book.main(["run", "--chapter", "none", "--out", str(tmp_path / "o"), "--seed", seed]),
    }[command]
    assert run_command() == 2
    err = capsys.readouterr().err
    assert "error: " in err and "seed" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- 9: full disks and odd paths

def test_training_onto_a_full_disk_is_one_line(files, tmp_path, capsys):
    with full_disk(tmp_path) as disk:
        assert main(train_args(files, disk / "run", "--max-steps", "2")) == 2
        one_line_error(capsys, f"--out {disk / 'run'}: 0.0 MiB free on its disk", "checkpoints need about")
        run = disk / "run"
        assert not run.exists() or sorted(p.name for p in run.iterdir()) == []  # no lock, no checkpoint left behind


def test_translations_onto_a_full_disk_leave_no_file(run, tmp_path, capsys):
    with full_disk(tmp_path) as disk:
        assert main(translate_args(run / "best.pt", tmp_path, disk / "hyp.txt")) == 2
        one_line_error(capsys, "no space left on device", "hyp.txt")
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]


@pytest.fixture
def toy_dataset(monkeypatch):
    from test_download import TOY_CONTENT, TOY_FILE

    monkeypatch.setitem(download.MANIFEST, "toy", [(TOY_FILE, "https://example.invalid/lines.txt")])
    monkeypatch.setitem(download.SHA256, TOY_FILE, __import__("hashlib").sha256(TOY_CONTENT).hexdigest())
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    return TOY_FILE, TOY_CONTENT


def mirror_with(tmp_path: Path, relpath: str, content: bytes) -> Path:
    (tmp_path / "mirror" / relpath).parent.mkdir(parents=True)
    (tmp_path / "mirror" / relpath).write_bytes(content)
    return tmp_path / "mirror"


@pytest.mark.parametrize("fault, words", [
    ("full disk", ["no space left on device", "nothing was written"]),
    ("unreadable mirror file", ["cannot read the mirror file", "permission denied"]),
    ("cached file is a folder", ["is a folder"]),
])
def test_data_cache_faults_are_one_line(toy_dataset, tmp_path, monkeypatch, fault, words):
    relpath, content = toy_dataset
    mirror = mirror_with(tmp_path, relpath, content * 10_000)  # larger than the full disk's last block
    monkeypatch.setitem(download.SHA256, relpath, __import__("hashlib").sha256(content * 10_000).hexdigest())
    cache = tmp_path / "cache"
    with full_disk(tmp_path) if fault == "full disk" else contextlib.nullcontext() as disk:
        if fault == "full disk":
            cache = disk / "cache"
        elif fault == "unreadable mirror file":  # root reads a mode-000 file anyway: the error is made here
            real_open = open

            def refusing(path, *args, **kwargs):
                if str(path).startswith(str(mirror)):
                    raise PermissionError(13, "Permission denied", str(path))
                return real_open(path, *args, **kwargs)
            monkeypatch.setattr(download, "open", refusing, raising=False)
        else:
            (cache / relpath).mkdir(parents=True)
        with pytest.raises(MsgcoreError) as error:
            download.ensure("toy", cache=cache, mirror=mirror)
        message = str(error.value)
        assert "\n" not in message and all(word in message.lower() for word in words), message
        if fault != "cached file is a folder":
            assert not (cache / relpath).exists()


def test_a_lock_path_that_is_a_folder_is_one_line(files, tmp_path, capsys):
    (tmp_path / "o" / ".lock").mkdir(parents=True)
    assert main(train_args(files, tmp_path / "o", "--max-steps", "2")) == 2
    one_line_error(capsys, ".lock", "is a folder")


# ---------------------------------------------------------------------------- 11-12: the book and the cache scripts

def book_root(tmp_path: Path) -> Path:
    root = tmp_path / "bookroot"
    root.mkdir()
    (root / "_toc.yml").write_text("format: jb-book\nroot: intro\n")
    return root


@pytest.mark.parametrize("case, words", [
    ("out is a file", ["--out", "is a file"]),
    ("out is read-only", ["--out", "read-only"]),
    ("out on a full disk", ["no space left on device"]),
    ("root has no _toc.yml", ["has no _toc.yml"]),
    ("root is a file", ["is a file, not a folder"]),
])
def test_book_runner_faults_are_one_line(tmp_path, capsys, case, words):
    root, out = book_root(tmp_path), tmp_path / "out"
    with full_disk(tmp_path) if case == "out on a full disk" else contextlib.nullcontext() as disk:
        if case == "out is a file":
            out.write_text("x")
        elif case == "out is read-only":
            out.mkdir()
            out.chmod(0o555)
            out = out / "run"
        elif case == "out on a full disk":
            out = disk / "run"
        elif case == "root has no _toc.yml":
            (root / "_toc.yml").unlink()
        else:
            (root / "_toc.yml").unlink()
            root.rmdir()
            root.write_text("x")
        try:
            assert book.main(["run", "--scale", "smoke", "--root", str(root), "--out", str(out)]) == 2
        finally:
            (tmp_path / "out").chmod(0o755) if (tmp_path / "out").is_dir() else None
        err = capsys.readouterr().err
        assert err.startswith("msgcore.book: error: ") and len(err.strip().splitlines()) == 1, err
        assert all(word in err for word in words), err


@pytest.mark.parametrize("case, argv, words", [
    ("runs is a file", ["--unpack", "ARCHIVE"], ["MSGCORE_RUNS", "is a file"]),
    ("pack into a folder", ["--pack", "FOLDER"], ["--pack", "is a folder"]),
    ("pack onto a read-only path", ["--pack", "READONLY/cache.tar"], ["--pack", "read-only"]),
])
def test_cache_script_faults_are_one_line(tmp_path, capsys, monkeypatch, case, argv, words):
    archive = packed_cache(tmp_path, monkeypatch)
    (tmp_path / "readonly").mkdir(mode=0o555)
    if case == "runs is a file":
        (tmp_path / "a-file").write_text("x")
        monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path / "a-file"))
    paths = {"ARCHIVE": str(archive), "FOLDER": str(tmp_path), "READONLY": str(tmp_path / "readonly")}
    argv = [next((a.replace(k, v) for k, v in paths.items() if k in a), a) for a in argv]
    assert experiments_script.main(argv) == 2
    one_line_error(capsys, *words)
    assert list((tmp_path / "readonly").iterdir()) == []


def test_peers_bench_refuses_an_endless_budget(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_peers, "launch", lambda *a: pytest.fail("a worker started"))
    assert bench_peers.main(["--minutes", "inf", "--venv", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "--minutes", "finite")
