"""The book-wide scoreboard, built from the chapters' machine-readable results (`book/results/*.json`).

Each chapter's notebook writes its judged claims with `msgcore.verdicts.write_results`; this module reads them
back for the book's overview page and for README's results block, so that neither is ever written by hand. Every
chapter's row says whether its results are current in this checkout or stale, and why (msgcore.chapters):

    python -m msgcore.scoreboard            # rewrite README's block between the two markers from book/results
    python -m msgcore.scoreboard --check    # exit 1 when README's block differs from what the files say
    python -m msgcore.scoreboard --rejudge  # judge every results file's evidence again under this protocol first
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from msgcore.utils import MsgcoreError, atomic_write
from msgcore.verdicts import DECIDED, MIN_SEEDS, NOT_RUN, VERDICTS, ProtocolError, cell_html, claim_from_dict, load_json, \
    observed_interval, system_from_dict

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "book" / "results"
README = REPO_ROOT / "README.md"
START, END = "<!-- scoreboard:start -->", "<!-- scoreboard:end -->"
REQUIRED = ("chapter", "scale", "commit", "claims", "systems")


def load_results(folder: str | Path = RESULTS_DIR) -> dict[str, dict]:
    """Notebook stem -> its results, in file-name order (the chapters' order); a malformed file is an error."""
    out = {}
    for path in sorted(Path(folder).glob("*.json")):
        data = load_json(path)
        missing = [key for key in REQUIRED if key not in data]
        if missing:
            raise MsgcoreError(f"{path}: a results file needs {', '.join(missing)}")
        out[path.stem] = data
    return out


def read_system(path: str | Path, name: str) -> dict | None:
    """One system of a chapter's results file: {"name", "scores" (test set -> metric -> scores in seed order),
    "updates", "scale", "commit", "stale" (why the file is not current, or an empty list)}; None when the file or
    the system is missing. How one chapter puts another's figure beside its own, as data, without importing that
    chapter's code or runs, and without passing a stale figure for a current one."""
    path = Path(path)
    if not path.is_file():
        return None
    data = load_json(path)
    system = next((s for s in data.get("systems", []) if s.get("name") == name), None)
    if system is None:
        return None
    return {"name": name, "scores": seed_ordered_scores(system), "updates": system.get("updates"),
            "scale": data.get("scale", "?"), "commit": data.get("commit", "?"), "stale": stale(path.stem, data)}


def seed_ordered_scores(system: dict) -> dict[str, dict[str, list[float]]]:
    """A stored system's scores as test set -> metric -> scores in seed order (a floor: its one score), from the
    evidence records, or from the lists of results files written before them."""
    if "measures" not in system:
        return system.get("scores", {})
    return {test: {metric: [m["scores"][k] for k in sorted(m["scores"], key=int)] for metric, m in by_metric.items()}
            for test, by_metric in system["measures"].items()}


def stale(stem: str, data: dict) -> list[str]:
    """Why a results file is not current in this checkout (msgcore.chapters.staleness); [] when it is. A file
    that is not one of the book's chapters says so."""
    from msgcore.chapters import CHAPTERS, staleness

    if stem not in CHAPTERS:
        return [f"{stem} is not one of the book's chapters"]
    return staleness(stem, data)


def status(stem: str, data: dict) -> str:
    """"current", or "stale: why" (every reason)."""
    reasons = stale(stem, data)
    return "current" if not reasons else "stale: " + "; ".join(reasons)


def counts(results: dict[str, dict]):
    """One row per chapter: its scale and commit, whether its results are current, then how many claims got each
    verdict (a stale chapter's counts are what its stale file says)."""
    import pandas as pd

    rows = []
    for stem, data in results.items():
        verdicts = [claim["verdict"] for claim in data["claims"]]
        rows.append({"chapter": data["chapter"], "scale": data["scale"], "commit": data["commit"],
                     "status": status(stem, data), "claims": len(verdicts),
                     **{name: verdicts.count(name) for name in VERDICTS}})
    return pd.DataFrame(rows, columns=["chapter", "scale", "commit", "status", "claims", *VERDICTS])


def overview(results: dict[str, dict]):
    """One short row per chapter: its claims, how many are decided, how many have evidence but no verdict yet, how
    many were not run, and the run its results come from (current or stale)."""
    import pandas as pd

    rows = []
    for stem, data in results.items():
        verdicts = [claim["verdict"] for claim in data["claims"]]
        decided = sum(verdicts.count(name) for name in DECIDED)
        rows.append({"chapter": data["chapter"], "claims": len(verdicts), "decided": decided,
                     "no verdict yet": len(verdicts) - decided - verdicts.count("not run"),
                     "not run": verdicts.count("not run"),
                     "results": f"`{data['scale']}` at {data['commit']}, "
                                f"{'current' if not stale(stem, data) else 'stale'}"})
    return pd.DataFrame(rows, columns=["chapter", "claims", "decided", "no verdict yet", "not run", "results"])


def claims(results: dict[str, dict]):
    """Every claim of the book: chapter, id, the paper's figure, ours, which way ours points, the verdict (marked
    when its chapter's results are stale) and its reason."""
    import pandas as pd

    rows = []
    for stem, data in results.items():
        mark = "" if not stale(stem, data) else " (stale)"
        rows += [{"chapter": data["chapter"], "id": c["id"], "paper": c["paper"], "ours": c["ours"] or "–",
                  "ours points": c.get("leans") or "–", "verdict": c["verdict"] + mark, "reason": c["reason"]}
                 for c in data["claims"]]
    return pd.DataFrame(rows, columns=["chapter", "id", "paper", "ours", "ours points", "verdict", "reason"])


def statements(results: dict[str, dict]):
    """The equal-budget statements of every chapter: how fast each system learns within its budget, never a
    verdict, kept apart from them."""
    import pandas as pd

    return pd.DataFrame([{"chapter": data["chapter"], "id": c["id"], "within an equal budget (not a verdict)":
                          c["statement"]} for data in results.values() for c in data["claims"] if c.get("statement")],
                        columns=["chapter", "id", "within an equal budget (not a verdict)"])


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
            scores = seed_ordered_scores(system)
            seeds = max((len(v) for metrics in scores.values() for v in metrics.values()), default=0)
            text = "; ".join(f"{test}: " + ", ".join(f"{metric} {score_text(values)}"
                                                    for metric, values in metrics.items() if values)
                             for test, metrics in scores.items())
            updates = system.get("updates")
            rows.append({"chapter": data["chapter"], "system": system["name"], "seeds": seeds,
                         "updates": "–" if updates is None else f"{updates:,}", "scores": text or "–"})
    return pd.DataFrame(rows, columns=["chapter", "system", "seeds", "updates", "scores"])


# ---- the scoreboard page: per chapter, one line of what its evidence says, then its claims in a table that fits

# The protocol's reasons by their first words (msgcore.verdicts.judge), and what they mean in plain words.
PLAIN_REASONS = (
    ("not run", "not run at this scale"),
    ("under-trained", "runs still improving"),
    ("unequal budgets", "unequal training budgets"),
    ("below floor", "a system no better than a trivial output"),
    ("below its own single-source", "below its own single-source baseline"),
    ("gate failed", "a sanity check failed"),
    ("no evidence", "training records missing"),
)
PLAIN_VERDICT_REASONS = {"reproduced": "", "smaller effect": "smaller than half the paper's effect",
                         "inconclusive": "the interval is too wide to tell"}
TOWARDS, AGAINST = "towards the paper", "against the paper"
GPU_COLUMN = "GPU-minutes to decide"  # one H100-class GPU, the seeds side by side, from scratch: an estimate
NO_RATE = "no GPU minutes per update given"  # the rates come from msgcore.costs (`chapter_rates`)


def plain_reason(claim: dict) -> str:
    """Why a claim has no verdict, or what its verdict rests on, in a few plain words."""
    reason, verdict = claim.get("reason", ""), claim["verdict"]
    if verdict == "indicative":
        return reason.split(":")[0]  # "1 seed (a verdict needs 3)"
    if verdict in PLAIN_VERDICT_REASONS:
        return PLAIN_VERDICT_REASONS[verdict]
    if verdict == "not reproduced":
        return "the effect points the other way" if "the other way" in reason else \
            "no effect of the paper's size" if "inside ±" in reason else "short of the paper's level"
    if reason.startswith("under-trained") and "cannot resolve" in reason:
        return "dev set too noisy to show a plateau"  # the runs stopped; their dev set cannot certify it
    return next((plain for start, plain in PLAIN_REASONS if reason.startswith(start)), reason.split(":")[0])


def direction(claim: dict) -> str:
    """Which way our figures point ("towards the paper" / "against the paper", '–' without evidence); marked
    "(no verdict)" where the protocol does not allow one."""
    leans = claim.get("leans", "")
    if not leans:
        return "–"
    text = TOWARDS if leans.startswith("towards") else AGAINST
    return text if claim["verdict"] in DECIDED else f"{text} (no verdict)"


def interval(claim: dict, systems: dict) -> list[float] | None:
    """The claim's stored 95% interval, or the one its evidence gives when the protocol allowed no verdict."""
    if claim.get("interval") and None not in claim["interval"]:
        return claim["interval"]
    if not claim.get("declaration") or not systems:
        return None
    return observed_interval(claim_from_dict(claim["declaration"]), systems)


def ours_text(claim: dict, systems: dict) -> str:
    """Our delta with its 95% interval ("+1.46 BLEU [+0.38, +2.54]"), or the claim's own evidence line without one."""
    bounds = interval(claim, systems)
    if bounds is None:
        return claim.get("ours") or "–"
    metric = claim.get("declaration", {}).get("metric", "")
    what = "" if claim["declaration"].get("kind") == "threshold" else "Δ "
    mean, low, high = bounds
    return f"{what}{mean:+.2f} {metric}, 95% CI [{low:+.2f}, {high:+.2f}]".replace("  ", " ")


def stage_key(stage) -> tuple:
    """A training stage as the same work wherever it appears, under whatever name a system gives it: its updates,
    its tokens and its dev curve."""
    return stage.updates, stage.source_tokens, stage.target_tokens, stage.dev_curve


def seedless_stages(systems: dict) -> set[tuple]:
    """The stages that do not depend on the seed (a pre-training every seed starts from): those found in the runs
    of two different seeds, in any of the chapter's systems."""
    seeds_of: dict[tuple, set[int]] = {}
    for system in systems.values():
        for run in system.runs:
            for stage in run.stages:
                seeds_of.setdefault(stage_key(stage), set()).add(run.seed)
    return {key for key, seeds in seeds_of.items() if len(seeds) > 1}


def updates_to_decide(claim: dict, systems: dict, seedless: set[tuple]) -> int:
    """The training updates a verdict on a claim rests on: every stage of its system's and its baseline's runs,
    each counted once (a stage the two share, or that every seed starts from), and the stages that depend on the
    seed scaled up to the seeds the protocol asks where a system has fewer."""
    declaration = claim.get("declaration") or {}
    counted, total = set(), 0.0
    for name in (declaration.get("system"), declaration.get("baseline")):
        system = systems.get(name)
        if system is None or system.floor or not system.runs:
            continue
        more_seeds = max(declaration.get("min_seeds", MIN_SEEDS) / len(system.runs), 1.0)
        for stage in (stage for run in system.runs for stage in run.stages):
            if stage_key(stage) not in counted:
                counted.add(stage_key(stage))
                total += stage.updates * (1.0 if stage_key(stage) in seedless else more_seeds)
    return round(total)


DECLARED_RUNS = re.compile(r"(\d+) runs × ([\d,]+) updates")  # verdicts.cpu_hours' wording, in a declared cost


def declared_updates(claim: dict) -> tuple[int, bool]:
    """A claim not run here: the updates of the runs its declared cost names (`verdicts.cpu_hours`, "3 runs × 2,928
    updates"), and whether part of that cost was not measured."""
    reason = claim.get("reason", "")
    updates = sum(int(runs) * int(each.replace(",", "")) for runs, each in DECLARED_RUNS.findall(reason))
    return updates, "not measured" in reason


def decide_cost(claim: dict, systems: dict, seedless: set[tuple], per_update: float | str) -> str:
    """What deciding a claim costs, in minutes of one H100-class GPU with the seeds side by side, from scratch (an
    estimate): its updates at its chapter's minutes per update, those of its runs (`updates_to_decide`), or, for a
    claim not run here, those its declared cost names (`declared_updates`); "> N" where that is a lower bound (runs
    that had not shown they converged, a cost not measured); '–' without updates or a rate."""
    if claim["verdict"] == NOT_RUN:
        updates, lower_bound = declared_updates(claim)
    else:
        updates, lower_bound = updates_to_decide(claim, systems, seedless), claim.get("converged") is False
    if isinstance(per_update, str) or not updates:
        return "–"
    minutes = max(round(updates * per_update), 1)
    return f"> {minutes}" if lower_bound else f"≈ {minutes}"


def chapter_claims(stem: str, data: dict, per_update: float | str = NO_RATE):
    """One chapter's claims, a row each: the claim, the paper's figure, ours with its interval, which way ours
    points, the verdict (marked when the chapter's results are stale), why, in plain words, and what deciding it
    costs on a GPU (`decide_cost`; `per_update`: the chapter's GPU minutes per update, `costs.chapter_rate`)."""
    import pandas as pd

    systems = {}
    if data.get("protocol") is not None:
        systems = {d["name"]: system_from_dict(d) for d in data["systems"] if "measures" in d}
    seedless = seedless_stages(systems)
    mark = "" if not stale(stem, data) else " (stale)"
    rows = [{"claim": f"{c['id']}: {c['claim']}", "paper": c["paper"], "ours": ours_text(c, systems),
             "ours points": direction(c), "verdict": c["verdict"] + mark, "why": plain_reason(c),
             GPU_COLUMN: decide_cost(c, systems, seedless, per_update)}
            for c in data["claims"]]
    return pd.DataFrame(rows, columns=["claim", "paper", "ours", "ours points", "verdict", "why", GPU_COLUMN])


def chapter_summary(stem: str, data: dict) -> str:
    """What a chapter's evidence says so far, in one line: how many claims are decided, which way the others point,
    and what stands in the way of the rest."""
    from collections import Counter

    claims_ = data["claims"]
    if not claims_:
        return f"{data['chapter']}: no claims of its own."
    decided = Counter(c["verdict"] for c in claims_ if c["verdict"] in DECIDED)
    leaning = Counter(direction(c).split(" (")[0] for c in claims_ if c.get("leans") and c["verdict"] not in DECIDED)
    blocks = Counter(plain_reason(c) for c in claims_ if c["verdict"] not in DECIDED)
    parts = [f"{sum(decided.values())} of {len(claims_)} claims decided" +
             (f" ({', '.join(f'{n} {v}' for v, n in decided.most_common())})" if decided else "")]
    if leaning:
        parts.append(f"without a verdict, {leaning[TOWARDS]} point towards the paper and {leaning[AGAINST]} "
                     f"against it")
    if blocks:
        parts.append("in the way: " + ", ".join(f"{why} ({n})" for why, n in blocks.most_common()))
    reasons = stale(stem, data)
    if reasons:
        parts.append(f"stale: {reasons[0]}")
    return f"{data['chapter']}: " + "; ".join(parts) + "."


def html_table(frame) -> str:
    """A plain HTML table (a header row, then a row each) whose cells are `html_text`."""
    head = "".join(f"<th>{cell_html(c)}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell_html(v)}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f'<table class="msgcore-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def chapter_sections(results: dict[str, dict], rates: dict[str, float | str] | None = None) -> str:
    """The scoreboard page's body as HTML: per chapter, its one-line summary, then its claims folded away (`rates`:
    each chapter's GPU minutes per update, `costs.chapter_rates`, for what deciding each claim costs)."""
    sections = []
    for stem, data in results.items():
        line = chapter_summary(stem, data)[len(data["chapter"]) + 2:]
        sections.append(f'<p class="msgcore-summary"><strong>{cell_html(data["chapter"])}</strong>: '
                        f'{cell_html(line)}</p>')
        if data["claims"]:
            sections.append(f'<details class="msgcore-claims"><summary>its {len(data["claims"])} claims</summary>'
                            f'{html_table(chapter_claims(stem, data, (rates or {}).get(stem, NO_RATE)))}</details>')
    return "\n".join(sections)


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
    said = statements(results)
    within = (f"\n\nWithin equal budgets, where the runs have not converged (statements, not verdicts):\n\n"
              f"{markdown_table(said)}" if len(said) else "")
    return (f"Verdicts per chapter (from `book/results/*.json`, written by each chapter's notebook; a stale chapter's "
            f"results come from code or a recipe that has changed since, and wait for a re-run):\n\n"
            f"{markdown_table(counts(results))}\n\nEvery claim:\n\n{markdown_table(claims(results))}{within}\n\n"
            f"<details><summary>Every system's scores (mean ± standard deviation over seeds; floors included)"
            f"</summary>\n\n{markdown_table(systems(results))}\n\n</details>")


def rejudge_files(folder: str | Path = RESULTS_DIR) -> list[Path]:
    """Judge the evidence of every results file again under this protocol and rewrite the files whose verdicts
    changed (a file written before results carried their evidence is left as it is); returns the files rewritten."""
    from dataclasses import asdict

    from msgcore.verdicts import PROTOCOL_VERSION, rejudge

    rewritten = []
    for path in sorted(Path(folder).glob("*.json")):
        data = load_json(path)
        if data.get("protocol") is None:
            continue
        claims_ = [asdict(v) for v in rejudge(data)]
        if claims_ == data["claims"] and data["protocol"] == PROTOCOL_VERSION:
            continue
        with atomic_write(path, "w", encoding="utf-8") as f:
            json.dump({**data, "protocol": PROTOCOL_VERSION, "claims": claims_}, f, indent=1, ensure_ascii=False)
        rewritten.append(path)
    return rewritten


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
    parser.add_argument("--rejudge", action="store_true", help="re-judge every results file's evidence first")
    args = parser.parse_args(argv)
    try:
        if args.rejudge:
            for path in rejudge_files(args.results):
                print(f"{path}: re-judged under this protocol")
        text = args.readme.read_text(encoding="utf-8")
        updated = replace_block(text, readme_block(load_results(args.results)))
    except (MsgcoreError, ProtocolError, OSError) as error:
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
