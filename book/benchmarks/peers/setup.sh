#!/usr/bin/env bash
# Installs the peers of `python -m msgcore.bench_peers` (JoeyNMT, Hugging Face transformers, CTranslate2) into a
# venv of their own, never into the book's .venv: they are benchmark-only dependencies. Idempotent.
#
#   bash book/benchmarks/peers/setup.sh     # into $MSGCORE_PEERS_VENV, default ~/.cache/msgcore/peers-venv
#
# The venv gets the book venv's own torch, sentencepiece and sacrebleu releases (so that every toolkit runs the
# same kernels, and reads and scores with the same tokenizer and BLEU), the peers at pinned releases, and msgcore
# itself (editable, without its dependencies) for the data loading and scoring that the benchmark's workers share.
# JoeyNMT 2.3.0 (its last release) needs two packages it does not declare: importlib_metadata, and accelerate for
# transformers' Trainer.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
venv=${MSGCORE_PEERS_VENV:-$HOME/.cache/msgcore/peers-venv}
main_python=${MSGCORE_PYTHON:-$root/.venv/bin/python}
[ -x "$main_python" ] || { echo "error: no book venv at $root/.venv: run bash .ci/install first" >&2; exit 2; }
JOEYNMT=${JOEYNMT_VERSION:-2.3.0}
TRANSFORMERS=${TRANSFORMERS_VERSION:-5.23.0}
CTRANSLATE2=${CTRANSLATE2_VERSION:-4.8.5}

pins=$("$main_python" - <<'PY'
import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in ("torch", "sentencepiece", "sacrebleu")))
PY
)
[ -x "$venv/bin/python" ] || "$main_python" -m venv "$venv"
install() {  # quiet, without the notes this machine's pip configuration prints about local package folders
    "$venv/bin/python" -m pip install --disable-pip-version-check -q "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}
# shellcheck disable=SC2086  # $pins is a list of requirements
install $pins
# shellcheck disable=SC2086
install "joeynmt==$JOEYNMT" "transformers==$TRANSFORMERS" "ctranslate2==$CTRANSLATE2" $pins importlib_metadata \
  accelerate pandas tqdm
install --no-deps -e "$root"
"$venv/bin/python" - <<'PY'
import importlib.metadata as m
print("peers venv ready:", ", ".join(f"{p} {m.version(p)}" for p in ("torch", "joeynmt", "transformers",
                                                                     "ctranslate2", "sentencepiece", "sacrebleu")))
PY
echo "$venv"
