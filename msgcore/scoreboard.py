"""The book-wide scoreboard, built from the chapters' machine-readable results (`book/results/*.json`).

Each chapter's notebook writes its judged claims with `msgcore.verdicts.write_results`; this module reads them
back for the book's overview page and for README's results block, so that neither is ever written by hand:

    python -m msgcore.scoreboard            # rewrite README's block between the two markers from book/results
    python -m msgcore.scoreboard --check    # exit 1 when README's block differs from what the files say
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from msgcore.utils import MsgcoreError, atomic_write
from msgcore.verdicts import VERDICTS

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "book" / "results"
README = REPO_ROOT / "README.md"
START, END = "<!-- scoreboard:start -->", "<!-- scoreboard:end -->"
REQUIRED = ("chapter", "scale", "commit", "claims", "systems")


def load_results(folder: str | Path = RESULTS_DIR) -> dict[str, dict]:
    """Notebook stem -> its results, in file-name order (the chapters' order); a malformed file is an error."""
    out = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise MsgcoreError(f"{path}: not a readable results file ({error})") from None
        missing = [key for key in REQUIRED if key not in data]
        if missing:
            raise MsgcoreError(f"{path}: a results file needs {', '.join(missing)}")
        out[path.stem] = data
    return out


def read_system(path: str | Path, name: str) -> dict | None:
    """One system of a chapter's results file, with the file's scale and commit: {"name", "scores", "updates",
    "scale", "commit"}; None when the file or the system is missing. How one chapter puts another's figure beside
    its own, as data, without importing that chapter's code or runs."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise MsgcoreError(f"{path}: not a readable results file ({error})") from None
    system = next((s for s in data.get("systems", []) if s.get("name") == name), None)
    return None if system is None else {**system, "scale": data.get("scale", "?"), "commit": data.get("commit", "?")}


def counts(results: dict[str, dict]):
    """One row per chapter: its scale and commit, then how many claims got each verdict."""
    import pandas as pd

    rows = []
    for data in results.values():
        verdicts = [claim["verdict"] for claim in data["claims"]]
        rows.append({"chapter": data["chapter"], "scale": data["scale"], "commit": data["commit"],
                     "claims": len(verdicts), **{name: verdicts.count(name) for name in VERDICTS}})
    return pd.DataFrame(rows, columns=["chapter", "scale", "commit", "claims", *VERDICTS])


def claims(results: dict[str, dict]):
    """Every claim of the book: chapter, id, the paper's figure, ours, the verdict and its reason."""
    import pandas as pd

    return pd.DataFrame([{"chapter": data["chapter"], "id": c["id"], "paper": c["paper"], "ours": c["ours"] or "–",
                          "verdict": c["verdict"], "reason": c["reason"]}
                         for data in results.values() for c in data["claims"]])


def score_text(values: list[float]) -> str:
    """Per-seed scores as one figure: the value for one seed, mean ± sample standard deviation for several."""
    import statistics

    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def systems(results: dict[str, dict]):
    """Every system the chapters scored: its seeds, its updates, and each test set's metrics (mean ± sd over
    seeds), so that README's figures, like the verdicts, are read from the results files."""
    import pandas as pd

    rows = []
    for data in results.values():
        for system in data["systems"]:
            scores = system.get("scores", {})
            seeds = max((len(v) for metrics in scores.values() for v in metrics.values()), default=0)
            text = "; ".join(f"{test}: " + ", ".join(f"{metric} {score_text(values)}"
                                                    for metric, values in metrics.items() if values)
                             for test, metrics in scores.items())
            updates = system.get("updates")
            rows.append({"chapter": data["chapter"], "system": system["name"], "seeds": seeds,
                         "updates": "–" if updates is None else f"{updates:,}", "scores": text or "–"})
    return pd.DataFrame(rows, columns=["chapter", "system", "seeds", "updates", "scores"])


def markdown_table(frame) -> str:
    """A pipe table (pandas' to_markdown needs tabulate, which the book does not install)."""
    cells = [[str(v).replace("|", "\\|").replace("\n", " ") for v in row] for row in frame.itertuples(index=False)]
    header = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def readme_block(results: dict[str, dict]) -> str:
    """README's generated results: the counts per chapter, every claim, then every system's scores."""
    if not results:
        return "No chapter has written its results yet."
    return (f"Verdicts per chapter (from `book/results/*.json`, written by each chapter's notebook):\n\n"
            f"{markdown_table(counts(results))}\n\nEvery claim:\n\n{markdown_table(claims(results))}\n\n"
            f"<details><summary>Every system's scores (mean ± standard deviation over seeds; floors included)"
            f"</summary>\n\n{markdown_table(systems(results))}\n\n</details>")


def replace_block(text: str, block: str) -> str:
    """`text` with everything between the START and END markers replaced by `block`."""
    if START not in text or END not in text or text.index(START) > text.index(END):
        raise MsgcoreError(f"README has no {START} ... {END} block to fill")
    head, rest = text.split(START, 1)
    return f"{head}{START}\n{block}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m msgcore.scoreboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README's block is out of date")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of the chapters' results")
    parser.add_argument("--readme", type=Path, default=README)
    args = parser.parse_args(argv)
    try:
        text = args.readme.read_text(encoding="utf-8")
        updated = replace_block(text, readme_block(load_results(args.results)))
    except (MsgcoreError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.check:
        if updated != text:
            print(f"{args.readme}: the results block is out of date; run python -m msgcore.scoreboard",
                  file=sys.stderr)
            return 1
        return 0
    if updated != text:
        with atomic_write(args.readme, "w", encoding="utf-8") as f:
            f.write(updated)
    print(f"{args.readme}: results block from {len(load_results(args.results))} chapters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
