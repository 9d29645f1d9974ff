"""The book-wide scoreboard (msgcore.scoreboard): built from the chapters' results files, never by hand."""
import json
from pathlib import Path

import pytest

from msgcore import scoreboard, verdicts as V
from msgcore.utils import MsgcoreError

REPO_ROOT = Path(__file__).resolve().parent.parent


def write_chapter(folder: Path, stem: str, verdict_names) -> None:
    judged = [V.Verdict(f"c{k}", "A beats B", "+1.3", "A 1.00 vs B 0.50 BLEU (1 seed)", name, "why")
              for k, name in enumerate(verdict_names)]
    V.write_results(folder / f"{stem}.json", chapter=stem.upper(), scale="small", commit="abc1234",
                    verdicts=judged, systems={})


def test_counts_and_claims_come_from_the_files(tmp_path: Path) -> None:
    write_chapter(tmp_path, "ch01", [V.INDICATIVE, V.NOT_DECIDED, V.NOT_DECIDED])
    write_chapter(tmp_path, "ch00", [V.REPRODUCED])
    results = scoreboard.load_results(tmp_path)
    assert list(results) == ["ch00", "ch01"]
    table = scoreboard.counts(results).set_index("chapter")
    assert table.loc["CH01", "not decided"] == 2 and table.loc["CH01", "indicative"] == 1
    assert table.loc["CH01", "claims"] == 3 and table.loc["CH00", "reproduced"] == 1
    assert len(scoreboard.claims(results)) == 4


def run(seed: int, updates: int = 1200) -> V.RunRecord:
    return V.RunRecord(seed, (V.Stage("training", ((600, 10.0 + seed), (updates, 12.0 + seed)), updates),))


def test_systems_table_gives_one_seed_as_is_and_several_as_mean_and_spread(tmp_path: Path) -> None:
    seeds = lambda values: V.Measure(dict(enumerate(values)))
    systems = {"A": V.System("A", {"test": {"BLEU": seeds([30.0, 32.0, 34.0]), "chrF": seeds([50.0, 50.0, 50.0])}},
                             (run(0), run(1), run(2))),
               "copy": V.floor_system("copy", "test", "BLEU", 0.5)}
    V.write_results(tmp_path / "ch01.json", chapter="CH01", scale="small", commit="abc1234", verdicts=[],
                    systems=systems)
    table = scoreboard.systems(scoreboard.load_results(tmp_path)).set_index("system")
    assert table.loc["A", "scores"] == "test: BLEU 32.00 ± 2.00, chrF 50.00 ± 0.00"
    assert table.loc["A", "seeds"] == 3 and table.loc["A", "updates"] == "1,200"
    assert table.loc["copy", "scores"] == "test: BLEU 0.50" and table.loc["copy", "updates"] == "–"


def test_readme_block_is_rewritten_between_its_markers_and_checked(tmp_path: Path) -> None:
    write_chapter(tmp_path, "ch00", [V.INDICATIVE])
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n\nbefore\n{scoreboard.START}\nold block\n{scoreboard.END}\nafter\n")
    args = ["--results", str(tmp_path), "--readme", str(readme)]
    assert scoreboard.main([*args, "--check"]) == 1
    assert scoreboard.main(args) == 0
    text = readme.read_text()
    assert "old block" not in text and text.startswith("# t\n\nbefore\n") and text.endswith("after\n")
    assert "| CH00 | small | abc1234 | stale: ch00 is not one of the book's chapters | 1 | 0 | 0 | 0 | 0 | 1 |" in text
    assert scoreboard.main([*args, "--check"]) == 0


def test_bad_results_files_and_a_readme_without_markers_are_one_line_errors(tmp_path: Path, capsys) -> None:
    (tmp_path / "ch09.json").write_text("{not json")
    with pytest.raises(MsgcoreError, match="not a readable results file"):
        scoreboard.load_results(tmp_path)
    (tmp_path / "ch09.json").write_text(json.dumps({"chapter": "x"}))
    with pytest.raises(MsgcoreError, match="needs scale, commit, claims, systems"):
        scoreboard.load_results(tmp_path)
    (tmp_path / "ch09.json").unlink()
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert scoreboard.main(["--results", str(tmp_path), "--readme", str(readme)]) == 2
    assert "no <!-- scoreboard:start -->" in capsys.readouterr().err
    assert readme.read_text() == "# no markers\n"


def test_the_committed_readme_says_what_the_committed_results_say() -> None:
    assert scoreboard.main(["--check"]) == 0


def test_a_stale_results_file_is_never_shown_as_current(tmp_path: Path) -> None:
    """Every committed results file is current at HEAD or marked stale: the status comes from comparing what the
    file recorded (protocol, numerics, recipe) with this checkout, never from the file's own word."""
    from msgcore import chapters

    for stem, data in scoreboard.load_results().items():
        reasons = chapters.staleness(stem, data)
        row = scoreboard.counts({stem: data}).iloc[0]
        assert row["status"] == ("current" if not reasons else "stale: " + "; ".join(reasons))
        if reasons:
            assert all(v.endswith("(stale)") for v in scoreboard.claims({stem: data})["verdict"])
    judged = [V.Verdict("c0", "A beats B", "+1.3", "", V.REPRODUCED, "")]
    identity = chapters.identity("ch00_transformer_baseline", "small")
    V.write_results(tmp_path / "ch00_transformer_baseline.json", "0", "small", "abc", judged, {}, identity)
    current = scoreboard.load_results(tmp_path)
    assert scoreboard.counts(current).loc[0, "status"] == "current"
    older = {**current["ch00_transformer_baseline"], "numerics": {**identity["numerics"], "core": 0}}
    assert scoreboard.status("ch00_transformer_baseline", older).startswith("stale: core numerics 0 →")
    other_recipe = {**current["ch00_transformer_baseline"], "recipe": "0" * 16}
    assert scoreboard.status("ch00_transformer_baseline", other_recipe) == "stale: its `small` recipe changed since"
    legacy = {"chapter": "0", "scale": "small", "commit": "x", "claims": [], "systems": []}
    assert "a re-run decides it again" in scoreboard.status("ch00_transformer_baseline", legacy)


def test_statements_are_kept_apart_from_the_verdicts(tmp_path: Path) -> None:
    said = V.Verdict("c0", "A beats B", "+1.3", "", V.NOT_DECIDED, "under-trained: ...",
                     statement="within 4,000 updates: A ahead ...")
    V.write_results(tmp_path / "ch01.json", "CH01", "small", "abc", [said], {})
    results = scoreboard.load_results(tmp_path)
    assert list(scoreboard.statements(results)["id"]) == ["c0"]
    block = scoreboard.readme_block(results)
    assert "statements, not verdicts" in block and block.index("statements") > block.index("Every claim")


def seeded_system(name: str, scores: list[float], curve) -> V.System:
    runs = tuple(V.RunRecord(k, (V.Stage("training", tuple((u, dev + k / 10) for u, dev in curve), 4000, 400_000,
                                         380_000, dev_noise=0.1),)) for k in range(len(scores)))
    return V.System(name, {"test": {"BLEU": V.Measure(dict(enumerate(scores)))}}, runs)


def test_the_page_shows_an_interval_and_a_direction_where_the_protocol_allows_no_verdict(tmp_path: Path) -> None:
    """Runs still improving decide nothing, yet a reader sees how far and which way they point, marked as such."""
    rising = ((1000, 20.0), (2000, 26.0), (3000, 30.0), (4000, 34.0))
    systems = {"A": seeded_system("A", [35.0, 35.4, 35.2], rising), "B": seeded_system("B", [34.0, 34.2, 34.1], rising)}
    claim = V.Claim("c0", "A beats B", "A 31.3 vs B 30.0, +1.3", "better", "A", "BLEU", "test", baseline="B",
                    paper_delta=1.3, paper_baseline=30.0)
    judged = V.judge_all([claim], systems)
    assert judged[0].verdict == V.NOT_DECIDED and judged[0].interval is None
    V.write_results(tmp_path / "ch05_coverage_nat.json", "5. X", "small", "abc", judged, systems)
    stem, data = next(iter(scoreboard.load_results(tmp_path).items()))
    row = scoreboard.chapter_claims(stem, data).iloc[0]
    assert row["ours"] == "Δ +1.10 BLEU, 95% CI [+0.85, +1.35]"  # deltas 1.0, 1.2, 1.1: ± t(2) × 0.1 / √3
    assert row["ours points"] == "towards the paper (no verdict)" and row["why"] == "runs still improving"
    assert row["verdict"].startswith("not decided")
    line = scoreboard.chapter_summary(stem, data)
    assert line.startswith("5. X: 0 of 1 claims decided; without a verdict, 1 point towards the paper and 0 against")
    assert "in the way: runs still improving (1)" in line


def test_plain_reasons_and_cells_without_literal_backticks() -> None:
    claim = lambda verdict, reason: {"verdict": verdict, "reason": reason}
    assert scoreboard.plain_reason(claim(V.NOT_RUN, "not run at this scale (A); 3 seeds at `small`")) == \
        "not run at this scale"
    assert scoreboard.plain_reason(claim(V.NOT_DECIDED, "below floor: A 1.0 vs copy 2.0")) == \
        "a system no better than a trivial output"
    assert scoreboard.plain_reason(claim(V.NOT_DECIDED, "under-trained: A seed 0: phase 1: dev +1.20 over updates "
                                                        "3,000–4,000 (tolerance 0.30)")) == "runs still improving"
    assert scoreboard.plain_reason(claim(V.NOT_DECIDED, "under-trained: A seed 0: phase 1: the dev set cannot resolve "
                                                        "0.31 (its noise is ±0.33)")) == \
        "dev set too noisy to show a plateau"
    assert scoreboard.plain_reason(claim(V.INDICATIVE, "1 seed (a verdict needs 3): leans towards the claim")) == \
        "1 seed (a verdict needs 3)"
    assert scoreboard.plain_reason(claim(V.NOT_REPRODUCED, "delta -1.0 ...: the other way")) == \
        "the effect points the other way"
    assert scoreboard.direction({"verdict": V.REPRODUCED, "leans": "towards the claim"}) == "towards the paper"
    assert scoreboard.direction({"verdict": V.NOT_RUN}) == "–"
    assert V.cell_html("the `small` scale reads <sep> & more") == \
        "the <code>small</code> scale reads &lt;sep&gt; &amp; more"
    page = scoreboard.chapter_sections(scoreboard.load_results())
    assert "`" not in page and page.count("</details>") == \
        sum(bool(data["claims"]) for data in scoreboard.load_results().values())


def test_the_gpu_cost_of_deciding_counts_shared_work_once_and_scales_missing_seeds() -> None:
    """A pre-training every seed starts from counts once, under whatever name a system gives it; the seed's own
    stages of a system with fewer seeds than a verdict needs are scaled up to 3 seeds."""
    pretraining = lambda name: V.Stage(name, ((500, 10.0), (1000, 12.0)), 1000, 90_000, 80_000)
    finetuning = lambda seed, updates: V.Stage("fine-tuning", ((updates, 30.0 + seed),), updates, 9_000, 8_000)
    three = V.System("A", {"test": {"BLEU": V.Measure({0: 1.0, 1: 1.0, 2: 1.0})}},
                     tuple(V.RunRecord(s, (pretraining("pre-training"), finetuning(s, 200))) for s in range(3)))
    one = V.System("B", {"test": {"BLEU": V.Measure({0: 1.0})}},
                   (V.RunRecord(0, (pretraining("B, pre-training"), finetuning(5, 100))),))
    systems = {"A": three, "B": one}
    claim = {"verdict": V.INDICATIVE, "converged": True, "declaration": {"system": "A", "baseline": "B", "min_seeds": 3}}
    seedless = scoreboard.seedless_stages(systems)
    assert scoreboard.updates_to_decide(claim, systems, seedless) == 1000 + 3 * 200 + 3 * 100
    assert scoreboard.decide_cost(claim, systems, seedless, per_update=0.01) == "≈ 19"
    assert scoreboard.decide_cost({**claim, "converged": False}, systems, seedless, 0.01) == "> 19"  # needs more
    assert scoreboard.decide_cost(claim, systems, seedless, "its notebook recorded no cost") == "–"


def test_the_gpu_cost_of_a_claim_not_run_is_read_from_its_declared_cost() -> None:
    declared = f"not run at this scale (A); A: {V.cpu_hours(3, 2_500, 0.5)}; B: {V.cpu_hours(3, 1_000, 0.5)}"
    claim = {"verdict": V.NOT_RUN, "reason": declared, "declaration": {"system": "A", "baseline": "B"}}
    assert scoreboard.declared_updates(claim) == (10_500, False)
    assert scoreboard.decide_cost(claim, {}, set(), per_update=0.002) == "≈ 21"
    partly = {**claim, "reason": declared + "; C: cost not measured"}
    assert scoreboard.decide_cost(partly, {}, set(), per_update=0.002) == "> 21"
    assert scoreboard.decide_cost({**claim, "reason": "needs real machine translations"}, {}, set(), 0.002) == "–"
