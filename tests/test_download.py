"""Fetching data: checksums, mirror copies, downloads and their failures."""
import hashlib
import io
import urllib.error
from pathlib import Path

import pytest

from msgcore import download
from msgcore.utils import DataError

REPO = Path(__file__).resolve().parent.parent
TOY_CONTENT = b"ein Haus\nzwei Katzen\n"
TOY_FILE = "toy/lines.txt"


@pytest.fixture
def toy_dataset(monkeypatch):
    """A one-file dataset "toy" whose URL is never reachable for real."""
    monkeypatch.setitem(download.MANIFEST, "toy", [(TOY_FILE, "https://example.invalid/lines.txt")])
    monkeypatch.setitem(download.SHA256, TOY_FILE, hashlib.sha256(TOY_CONTENT).hexdigest())
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")  # no auto-detected mirror


def make_mirror(root: Path, content: bytes) -> Path:
    (root / "toy").mkdir(parents=True)
    (root / TOY_FILE).write_bytes(content)
    return root


def offline(*args, **kwargs):
    raise urllib.error.URLError("Temporary failure in name resolution")


def test_embedded_sums_equal_data_scripts_file():
    listed = {}
    for line in (REPO / "data_scripts" / "SHA256SUMS").read_text().splitlines():
        digest, relpath = line.split()
        listed[relpath] = digest
    assert listed == download.SHA256
    manifest_paths = {relpath for files in download.MANIFEST.values() for relpath, _ in files}
    assert manifest_paths == set(download.SHA256)


def test_good_mirror_copy_is_verified_and_cached(toy_dataset, tmp_path, monkeypatch):
    mirror = make_mirror(tmp_path / "mirror", TOY_CONTENT)
    folder = download.ensure("toy", cache=tmp_path / "cache", mirror=mirror)
    assert folder == tmp_path / "cache" / "toy"
    assert (folder / "lines.txt").read_bytes() == TOY_CONTENT
    # A second call finds the verified copy and needs neither mirror nor network.
    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    assert download.ensure("toy", cache=tmp_path / "cache") == folder


def test_mismatching_mirror_file_raises_and_leaves_no_file(toy_dataset, tmp_path):
    mirror = make_mirror(tmp_path / "mirror", b"something else\n")
    with pytest.raises(DataError, match=r"sha256 mismatch for toy/lines.txt: expected [0-9a-f]{64}, got [0-9a-f]{64}"):
        download.ensure("toy", cache=tmp_path / "cache", mirror=mirror)
    cache_folder = tmp_path / "cache" / "toy"
    assert not cache_folder.exists() or list(cache_folder.iterdir()) == []  # no file, no temporary left over


def test_corrupt_cached_file_is_fetched_again(toy_dataset, tmp_path):
    mirror = make_mirror(tmp_path / "mirror", TOY_CONTENT)
    (tmp_path / "cache" / "toy").mkdir(parents=True)
    (tmp_path / "cache" / TOY_FILE).write_bytes(b"truncated")
    download.ensure("toy", cache=tmp_path / "cache", mirror=mirror)
    assert (tmp_path / "cache" / TOY_FILE).read_bytes() == TOY_CONTENT


def test_download_is_verified(toy_dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(download.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(TOY_CONTENT))
    folder = download.ensure("toy", cache=tmp_path / "cache")
    assert (folder / "lines.txt").read_bytes() == TOY_CONTENT


def test_no_mirror_and_no_network_names_both_ways_out(toy_dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    with pytest.raises(DataError) as error:
        download.ensure("toy", cache=tmp_path / "cache")
    message = str(error.value)
    assert "MSGCORE_DATA_MIRROR=/path/to/mirror" in message
    assert "connect to the internet" in message
    assert "toy/lines.txt" in message and "\n" not in message


def test_unknown_dataset_lists_known_ones(tmp_path):
    with pytest.raises(DataError, match="unknown dataset 'multi31k'; known datasets: multi30k, multi30k-task2, wmt16-17-ape-en-de"):
        download.ensure("multi31k", cache=tmp_path)


def test_mirror_and_cache_locations(monkeypatch, tmp_path):
    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path / "data"))
    assert download.cache_dir() == tmp_path / "data"
    monkeypatch.delenv("MSGCORE_DATA")
    assert download.cache_dir() == Path.home() / ".cache" / "msgcore" / "data"
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", str(tmp_path))
    assert download.mirror_dir() == tmp_path
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    assert download.mirror_dir() is None
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="is not a folder"):
        download.mirror_dir()


def test_cli_reports_errors_in_one_line(toy_dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    assert download.main(["--cache", str(tmp_path), "toy"]) == 1
    assert capsys.readouterr().err.startswith("error: cannot fetch toy/lines.txt")
    mirror = make_mirror(tmp_path / "mirror", TOY_CONTENT)
    assert download.main(["--cache", str(tmp_path / "cache"), "--mirror", str(mirror), "toy"]) == 0


@pytest.mark.skipif(download.mirror_dir() is None, reason="no local data mirror")
def test_real_mirror_copy_verifies(tmp_path):
    folder = download.ensure("mlqe-pe-en-de", cache=tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["en-de-dev.tar.gz", "en-de-train.tar.gz"]


def test_stale_temporaries_of_killed_downloads_are_removed(toy_dataset, tmp_path):
    import os
    import time

    folder = tmp_path / "cache" / "toy"
    folder.mkdir(parents=True)
    stale, fresh = folder / ".lines.txt.abc123.tmp", folder / ".lines.txt.def456.tmp"
    stale.write_bytes(b"half a download")
    fresh.write_bytes(b"a download running beside us")
    old = time.time() - download.STALE_TMP_S - 60
    os.utime(stale, (old, old))
    download.ensure("toy", cache=tmp_path / "cache", mirror=make_mirror(tmp_path / "mirror", TOY_CONTENT))
    assert not stale.exists() and fresh.exists()
    assert (folder / "lines.txt").read_bytes() == TOY_CONTENT


def test_a_cache_that_is_a_file_is_one_line_error(toy_dataset, tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    with pytest.raises(DataError, match="is a file, not a folder; set MSGCORE_DATA"):
        download.ensure("toy", cache=cache, mirror=make_mirror(tmp_path / "mirror", TOY_CONTENT))


def test_a_read_only_cache_is_refused_before_fetching(toy_dataset, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    try:
        with pytest.raises(DataError, match="read-only; set MSGCORE_DATA to a writable folder") as error:
            download.ensure("toy", cache=cache, mirror=make_mirror(tmp_path / "mirror", TOY_CONTENT))
        assert "\n" not in str(error.value)
    finally:
        cache.chmod(0o755)
    assert not (cache / "toy").exists()


def test_cached_files_get_the_usual_permissions(toy_dataset, tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        folder = download.ensure("toy", cache=tmp_path / "cache", mirror=make_mirror(tmp_path / "mirror", TOY_CONTENT))
    finally:
        os.umask(old)
    assert stat.S_IMODE((folder / "lines.txt").stat().st_mode) == 0o644
