"""Fetch the book's public data sets into a local cache, verified against fixed sha256 sums.

Every file a loader in `msgcore.data` reads is listed in `MANIFEST` with its public URL and
its sha256 in `SHA256`. `ensure(dataset)` makes sure the cache holds verified copies:

1. a cached file whose sha256 matches is used as it is;
2. otherwise the file is copied from a local mirror (a folder laid out like the cache,
   e.g. `../shared/data` beside the repository, or `$MSGCORE_DATA_MIRROR`), or
3. downloaded from its public URL.

Copies and downloads are written to a temporary file and checked *before* they are renamed
into place, so the cache never holds a file with the wrong contents.
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO

from msgcore.utils import DataError, MsgcoreError, atomic_write, check_writable_dir, os_error_line

logger = logging.getLogger(__name__)

# The sha256 of every file, identical to data_scripts/SHA256SUMS (a test checks that they agree).
SHA256: dict[str, str] = {
    "doc-level-en-de/Europarl7/concatenated_en2de_dev_de.txt": "d75378d8f8482c4276e3c77be8f8c48e5577c064c05481b1a05cff1db5c5b0aa",
    "doc-level-en-de/Europarl7/concatenated_en2de_dev_en.txt": "938fde3fccaace0e221e2520dcb11d9b121ca3740308a4c7940692c96955b011",
    "doc-level-en-de/Europarl7/concatenated_en2de_test_de.txt": "60bd6552032d82bfd0fb9597bad8aec4f6cf333918cb56a5cf215003d983850a",
    "doc-level-en-de/Europarl7/concatenated_en2de_test_en.txt": "a82dd0099a1a786b9af99eeb2444bf0ad935d0a534cd883c5d560980fd07859c",
    "doc-level-en-de/IWSLT2017/concatenated_en2de_dev_de.txt": "b22638ac9a98861dbdc81def31472d7d816e64cd7cc06482fb041b69016340b6",
    "doc-level-en-de/IWSLT2017/concatenated_en2de_dev_en.txt": "ab2299d5f254f12128d49aac47614930ed83965e4c3548709ac428aa0a25e8ce",
    "doc-level-en-de/IWSLT2017/concatenated_en2de_test_de.txt": "9a6bb0f3f79879a6af26b3012d584853ba0d53700972ccdb799bb92aeb7d6912",
    "doc-level-en-de/IWSLT2017/concatenated_en2de_test_en.txt": "f8414019291f264368570a60cbc662ea2ac00f07d079624823f6553fa632e3d3",
    "doc-level-en-de/NC-2016/concatenated_en2de_dev_de.txt": "e482a04b2cc1e3015059de851dbb295afea7e79a3d76278561e6e5ad9939e110",
    "doc-level-en-de/NC-2016/concatenated_en2de_dev_en.txt": "bfc32336a5820c95b460a5a4cb715af93c43147bed01f7a6936ed3b0f1d7f719",
    "doc-level-en-de/NC-2016/concatenated_en2de_test_de.txt": "11f7dd3ba475ce6d4fa4b33bb949ed61fa847d46ff2bfbb81ef39d83f30fa110",
    "doc-level-en-de/NC-2016/concatenated_en2de_test_en.txt": "9edec9fe1259b7b4802a6e451cc2a8c0d1bc4851dcad24c91f30b79998f801be",
    "mlqe-pe-en-de/en-de-dev.tar.gz": "7ca5e97c00e9733ba97aa70ca03c1ac9840ececcc4a09900262027912d432c4c",
    "mlqe-pe-en-de/en-de-train.tar.gz": "219cdfd4e1d89d47e6136651af5136e3942ee93b4c9c44354b232baa18c75731",
    "multi30k-task2/test_2016.1.de.gz": "cf83315ea2e76c517fb41553ff25c7128d071397928a6b66a5d81479aeea950b",
    "multi30k-task2/test_2016.1.en.gz": "bf64274c8e1f73ba57d47409f707a640b3874a06e7e83adfb5a6d4c055bc6b29",
    "multi30k-task2/test_2016.2.de.gz": "327af090d22ddf624fe638f34e815b249bdfa033e3e48f55474e21d6b28efaa8",
    "multi30k-task2/test_2016.2.en.gz": "36c12dac199e336e74ebe91c5240a1c6cefce7af2a3f3a2054d184947932bc3c",
    "multi30k-task2/test_2016.3.de.gz": "b3236b4834c944cd42e6942da9041fee210cb2875574deefd41f130e5651a61b",
    "multi30k-task2/test_2016.3.en.gz": "2188662d22b01c5ecf7ae6a7c003b45fc83c510d34999c2340078e75088b0f1f",
    "multi30k-task2/test_2016.4.de.gz": "3843a960dc2c026d5d371c720cce830b6709d03c2f29e17b2923af11497da2c0",
    "multi30k-task2/test_2016.4.en.gz": "dcb6a0ad2ae40f54a1f9e9f20d3146c7f0a662feece2e78d2d511667bf229f08",
    "multi30k-task2/test_2016.5.de.gz": "c861f68362c443b07c8f919a9bd8c8ecd7f5fccf2b13bf4d4bd8e7fe8783880e",
    "multi30k-task2/test_2016.5.en.gz": "60e31317f0d960aed273d8ec527411935fb1ff3dee2c9cc9572259739ff193c0",
    "multi30k-task2/test_2016_images.txt": "871e8ecafc66fb13e044ecccf669d04a865b4c58553227df86b933f0337a1563",
    "multi30k-task2/train.1.de.gz": "0002241b52aba5160c08d644ea0d64a9bf46a2dfffcf619c9e3cdaa55b357004",
    "multi30k-task2/train.1.en.gz": "a0e057f07a9733199c0d755d77f6d583dc6f40a3180734b1130a216e2fdf3a3b",
    "multi30k-task2/train.2.de.gz": "ac7c29258b90aec0b64d677c5bfc831fc402e6296d0aa9cc7a3433ddbff85c37",
    "multi30k-task2/train.2.en.gz": "d79dd70a9eafb2d1fe40151621278c4ae69b3c148c5052a53d7c7a41bf3ba023",
    "multi30k-task2/train.3.de.gz": "ec5e6508813814aa31311b34e26e24f903dd7701f8d0668313259b7f975d7aa0",
    "multi30k-task2/train.3.en.gz": "86e16fdcc699bcb6bca0f87c3cf1051f7de5ee3674dd588cedc5200194282749",
    "multi30k-task2/train.4.de.gz": "bcee8ac6eb47d8a7dc8cff47d9a0fbd80b4363cfda22021bacd297f9604221a4",
    "multi30k-task2/train.4.en.gz": "3771b84e010ad6197806d2a1188cb07c12149e3e0d178dd5966dee5763733686",
    "multi30k-task2/train.5.de.gz": "dccb0ca6ff25e0b1f0d385f59fb809184e0db89622d88371725e3ec46d43bfc0",
    "multi30k-task2/train.5.en.gz": "73988689307fe836994eae59735dc840c15da9775455fa76e6ed22606a042a91",
    "multi30k-task2/train_images.txt": "97ee57e160a46c7d0e75298ebf57967e1245698a6f8806436ff07e61d1a41221",
    "multi30k-task2/val.1.de.gz": "a6b9ad98bdab8882d2ac40d1bc05db89341947162c07d2d0d27e80f01897ba05",
    "multi30k-task2/val.1.en.gz": "4ce8f8ffbef4a1c066e3f35a5ffc764666c26c318a733d9bdc6349577f1c6f9c",
    "multi30k-task2/val.2.de.gz": "dbbf0f8fa54fdb4a3c64d22a1c0773ade3f775c39e4513ab5ca6d683025086dc",
    "multi30k-task2/val.2.en.gz": "4103944d652127e5af33ba2761d71cb6c0e1509c1a67d4387dc67ad768cfb752",
    "multi30k-task2/val.3.de.gz": "5eac83b577fe9bc781e60b609545123804e9dd29de4c2bd1b9e178ad8b29a1da",
    "multi30k-task2/val.3.en.gz": "6ecd848713d98faa9c6db2e9e457a778335358e6e3a4743cf4e929a0516e399a",
    "multi30k-task2/val.4.de.gz": "1c3054cfd1e47f17d8a20fcec6615cfd26d7dc2c8c4ef4625cd9db9f4e4590ea",
    "multi30k-task2/val.4.en.gz": "bfab4f0cbdac6233f206bbbfbd324dc02b258e291c3f410a69f9884171008788",
    "multi30k-task2/val.5.de.gz": "185d6cb907313e6a6eef76f09c657e5748e08ee3c7a5b26200186e171e2c8344",
    "multi30k-task2/val.5.en.gz": "4b6a6541b7b58d545eff7feead4187aeb0439a7178a7bed6951121e0ecbaee66",
    "multi30k-task2/val_images.txt": "db26f03eaf833ec47bfaea129ed053b68cbcfc5d1f9a09c4cdf7c88fbfea7108",
    "multi30k/test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "multi30k/test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "multi30k/test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "multi30k/test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "multi30k/test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "multi30k/test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "multi30k/test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "multi30k/train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "multi30k/train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "multi30k/train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "multi30k/train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "multi30k/val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "multi30k/val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "multi30k/val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "multi30k/val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "wmt16-17-ape-en-de/train.mt": "c6be8c08eee9c11b7e70dbf22e7a1104e0dded7077a4b5e1d4882e79d95d7310",
    "wmt16-17-ape-en-de/train.pe": "c13d1e6cc69c13ffd204bf105a82d0e60b3d44637fb3a658b63336fda2cccca6",
    "wmt16-17-ape-en-de/train.src": "b56a83ef8ee2aa681c301e5283c2620b35133301f70e9a8f846022787d8ab177",
}

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/"
MULTI30K_TASK2_URL = "https://github.com/multi30k/dataset/raw/master/data/task2/"
APE_URL = "https://github.com/antoniogois/keystrokes_ape/raw/master/data/"
MLQE_PE_URL = "https://github.com/sheffieldnlp/mlqe-pe/raw/master/data/post-editing/"
DOC_LEVEL_URL = "https://github.com/sameenmaruf/selective-attn/raw/master/data/"

_MULTI30K_FILES = ([f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr")
                    for lang in ("en", "de", "fr", "cs")]
                   + [f"test_2017_flickr.{lang}.gz" for lang in ("en", "de", "fr")])
_TASK2_SPLITS = ("train", "val", "test_2016")
_MULTI30K_TASK2_FILES = ([(f"{split}.{k}.{lang}.gz", f"raw/{split}.{k}.{lang}.gz") for split in _TASK2_SPLITS
                          for k in range(1, 6) for lang in ("en", "de")]
                         + [(f"{split}_images.txt", f"image_splits/{split}_images.txt") for split in _TASK2_SPLITS])
_DOC_LEVEL_FILES = [f"{corpus}/concatenated_en2de_{split}_{lang}.txt" for corpus in ("IWSLT2017", "NC-2016", "Europarl7")
                    for split in ("dev", "test") for lang in ("en", "de")]

# dataset name -> [(path relative to the cache / mirror root, public URL)]
MANIFEST: dict[str, list[tuple[str, str]]] = {
    "multi30k": [(f"multi30k/{name}", MULTI30K_URL + name) for name in _MULTI30K_FILES],
    "multi30k-task2": [(f"multi30k-task2/{name}", MULTI30K_TASK2_URL + path) for name, path in _MULTI30K_TASK2_FILES],
    "wmt16-17-ape-en-de": [(f"wmt16-17-ape-en-de/train.{ext}", APE_URL + f"train.{ext}")
                           for ext in ("src", "mt", "pe")],
    "mlqe-pe-en-de": [(f"mlqe-pe-en-de/en-de-{split}.tar.gz", MLQE_PE_URL + f"{split}/en-de-{split}.tar.gz")
                      for split in ("train", "dev")],
    "doc-level-en-de": [(f"doc-level-en-de/{name}", DOC_LEVEL_URL + name) for name in _DOC_LEVEL_FILES],
}
DATASETS: tuple[str, ...] = tuple(MANIFEST)

_REPO_ROOT = Path(__file__).resolve().parent.parent
_CHUNK = 1 << 20


def cache_dir() -> Path:
    """Where verified data files live: `$MSGCORE_DATA`, else `~/.cache/msgcore/data`."""
    return Path(os.environ.get("MSGCORE_DATA") or Path.home() / ".cache" / "msgcore" / "data")


def mirror_dir() -> Path | None:
    """A local copy of the public files: `$MSGCORE_DATA_MIRROR`, else `<repo>/../shared/data` if it exists.

    Setting `MSGCORE_DATA_MIRROR` to the empty string turns the mirror off (always download).
    """
    configured = os.environ.get("MSGCORE_DATA_MIRROR")
    if configured is not None:
        if not configured:
            return None
        if not Path(configured).is_dir():
            raise DataError(f"MSGCORE_DATA_MIRROR={configured} is not a folder; point it at a copy of the data "
                            f"(holding SHA256SUMS, multi30k/, ...) or unset it")
        return Path(configured)
    beside_repo = _REPO_ROOT.parent / "shared" / "data"
    return beside_repo if (beside_repo / "SHA256SUMS").is_file() else None


def sha256_of(path: str | os.PathLike) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def ensure(dataset: str, cache: str | os.PathLike | None = None,
           mirror: str | os.PathLike | None = None) -> Path:
    """Make sure every file of `dataset` is in the cache with the right sha256; return its folder.

    `cache` defaults to `cache_dir()` and `mirror` to `mirror_dir()`. Raises `DataError` for an
    unknown dataset, a checksum mismatch, or when a file is neither in the mirror nor downloadable.
    """
    if dataset not in MANIFEST:
        raise DataError(f"unknown dataset {dataset!r}; known datasets: {', '.join(DATASETS)}")
    cache = Path(cache) if cache is not None else cache_dir()
    mirror = Path(mirror) if mirror is not None else mirror_dir()
    if cache.exists() and not cache.is_dir():
        raise DataError(f"the data cache {cache} is a file, not a folder; set MSGCORE_DATA to a folder")
    remove_stale_temporaries(cache / dataset)
    for relpath, url in MANIFEST[dataset]:
        _ensure_file(relpath, url, cache, mirror)
    return cache / dataset


STALE_TMP_S = 600  # a temporary file untouched this long was left by a killed download (live ones grow)


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the hidden `.NAME.*.tmp` files that killed downloads or copies left in `folder`; returns them.

    Only files unmodified for STALE_TMP_S seconds go: a download running beside us keeps writing its own."""
    now = time.time()
    candidates = sorted(folder.rglob(".*.tmp")) if folder.is_dir() else []
    stale = [path for path in candidates if now - path.stat().st_mtime > STALE_TMP_S]
    for path in stale:
        try:
            path.unlink()
        except OSError:
            pass  # another process may be writing it right now, or the cache is read-only
    return stale


def check_cache_writable(cache: Path, relpath: str) -> None:
    """Before fetching `relpath`: the cache must be a folder we may write (one line naming MSGCORE_DATA)."""
    try:
        check_writable_dir(cache / relpath.split("/")[0], "the data cache folder")
    except MsgcoreError as error:
        raise DataError(f"cannot fetch {relpath}: {error}; set MSGCORE_DATA to a writable folder") from None


def _ensure_file(relpath: str, url: str, cache: Path, mirror: Path | None) -> None:
    """Bring one file into the cache, unless a verified copy is already there."""
    target = cache / relpath
    expected = SHA256[relpath]
    if target.is_dir():
        raise DataError(f"the cached file {target} is a folder; remove it (or set MSGCORE_DATA to another folder)")
    if target.is_file():
        if sha256_of(target) == expected:
            return
        logger.warning("%s in the cache has the wrong sha256; fetching it again", relpath)
    check_cache_writable(cache, relpath)
    if mirror is not None and (mirror / relpath).is_file():
        logger.info("copying %s from %s", relpath, mirror)
        try:
            source = open(mirror / relpath, "rb")
        except OSError as error:
            raise DataError(f"cannot read the mirror file {mirror / relpath} ({os_error_line(error)}); fix its "
                            f"permissions or unset MSGCORE_DATA_MIRROR") from None
        with source:
            _write_verified(source, target, relpath, expected, origin=f"the mirror file {mirror / relpath}")
        return
    logger.info("downloading %s", url)
    _download(url, target, relpath, expected, mirror)


def _download(url: str, target: Path, relpath: str, expected: str, mirror: Path | None) -> None:
    """Download `url` into `target`, verifying it; network failures become one clear DataError."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            _write_verified(response, target, relpath, expected, origin=url)
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as error:
        reason = getattr(error, "reason", error)
        where = f"it is not in the mirror {mirror}" if mirror is not None else "no local mirror is set"
        raise DataError(
            f"cannot fetch {relpath}: {where} and downloading {url} failed ({reason}). Either set "
            f"MSGCORE_DATA_MIRROR=/path/to/mirror (a folder holding {relpath}) or connect to the internet, "
            f"then rerun `python data_scripts/download.py {relpath.split('/')[0]}`") from None


def _write_verified(source: BinaryIO, target: Path, relpath: str, expected: str, origin: str) -> None:
    """Copy `source` to `target` through a temporary file that is renamed only if its sha256 matches."""
    digest = hashlib.sha256()
    try:
        with atomic_write(target, "wb") as out:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
            if digest.hexdigest() != expected:
                raise DataError(f"sha256 mismatch for {relpath}: expected {expected}, got {digest.hexdigest()} "
                                f"(from {origin}); nothing was written to the cache. Delete or replace the bad "
                                f"file / check the mirror (`sha256sum -c SHA256SUMS` there)")
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        raise  # the network's failures: _download says what to do about them
    except OSError as error:  # a full disk, or a source that cannot be read: nothing is left in the cache
        raise DataError(f"cannot fetch {relpath} from {origin}: {os_error_line(error)}; nothing was written to "
                        f"the cache") from None


def main(argv: list[str] | None = None) -> int:
    """Command line: fetch the named datasets (all by default) into the cache."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="*", metavar="DATASET", help=f"any of {', '.join(DATASETS)} (default: all)")
    parser.add_argument("--mirror", help="folder holding a copy of the files (default: $MSGCORE_DATA_MIRROR "
                                         "or ../shared/data beside the repository)")
    parser.add_argument("--cache", help="where to put the verified files (default: $MSGCORE_DATA "
                                        "or ~/.cache/msgcore/data)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        for dataset in args.datasets or DATASETS:
            folder = ensure(dataset, cache=args.cache, mirror=args.mirror)
            print(f"{dataset}: ok ({folder})")
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
