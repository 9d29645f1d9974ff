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


def test_systems_table_gives_one_seed_as_is_and_several_as_mean_and_spread(tmp_path: Path) -> None:
    systems = {"A": V.System("A", {"test": {"BLEU": [30.0, 32.0, 34.0], "chrF": [50.0, 50.0, 50.0]}}, updates=1200),
               "copy": V.System("copy", {"test": {"BLEU": [0.5]}})}
    V.write_results(tmp_path / "ch01.json", chapter="CH01", scale="small", commit="abc1234", verdicts=[],
                    systems=systems)
    table = scoreboard.systems(scoreboard.load_results(tmp_path)).set_index("system")
    assert table.loc["A", "scores"] == "test: BLEU 32.00 ± 2.00, chrF 50.00 ± 0.00"
    assert table.loc["A", "seeds"] == 3 and table.loc["A", "updates"] == "1,200"
    assert table.loc["copy", "scores"] == "test: BLEU 0.50" and table.loc["copy", "updates"] == "–"


def test_readme_block_is_rewritten_between_its_markers_and_checked(tmp_path: Path) -> None:
    write_chapter(tmp_path, "ch00", [V.INDICATIVE])
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n\nbefore\n{scoreboard.START}\nstale\n{scoreboard.END}\nafter\n")
    args = ["--results", str(tmp_path), "--readme", str(readme)]
    assert scoreboard.main([*args, "--check"]) == 1
    assert scoreboard.main(args) == 0
    text = readme.read_text()
    assert "stale" not in text and text.startswith("# t\n\nbefore\n") and text.endswith("after\n")
    assert "| CH00 | small | abc1234 | 1 | 0 | 0 | 0 | 1 |" in text
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
