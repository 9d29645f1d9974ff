"""The reader's check of the built book (msgcore.pagecheck): what it finds on pages made to fail, and nothing on a
clean one. The browser parts run where Chromium is installed."""
import shutil
from pathlib import Path

import pytest

from msgcore import pagecheck

HAS_CHROMIUM = any(shutil.which(name) for name in pagecheck.CHROMIUM_NAMES)
LONG = " ".join(["indented_statement_that_is_long()"] * 8)
BAD_PAGE = f"""<!DOCTYPE html><html><head><meta name="viewport" content="width=device-width, initial-scale=1">
<style>table {{ border-collapse: collapse }} td {{ white-space: nowrap }}</style></head><body><main>
<table><thead><tr>{''.join(f'<th>column {i}</th>' for i in range(12))}</tr></thead>
<tbody><tr>{''.join(f'<td>value-{i}-wide</td>' for i in range(12))}</tr></tbody></table>
<details><summary>folded</summary><table><tbody><tr>{''.join(f'<td>folded-{i}-wide</td>' for i in range(12))}</tr>
</tbody></table></details>
<p>the `small` scale</p><p>BLEU nan</p><p>data in <code>~/.cache/msgcore/data</code> by default</p>
<div class="cell_output"><pre>resuming ~/.cache/runs/abc</pre><pre>cache at /home/someone/.cache/msgcore</pre></div>
<div class="highlight-python"><pre style="white-space: pre-wrap">def f():\n    {LONG}\n</pre></div>
</main></body></html>"""
CLEAN_PAGE = """<!DOCTYPE html><html><head><meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><main><table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr></tbody></table>
<details><summary>folded</summary><table><tbody><tr><td>1</td><td>2</td></tr></tbody></table></details>
<p>the <code>small</code> scale: nanoGPT, a finance note, BLEU –</p>
<div class="highlight-python"><pre style="white-space: pre; overflow-x: auto">def f():\n    return 1\n</pre></div>
</main></body></html>"""


def book(tmp_path: Path, **pages: str) -> Path:
    (tmp_path / "index.html").write_text("<html><body>index</body></html>")
    for name, text in pages.items():
        (tmp_path / f"{name}.html").write_text(text)
    return tmp_path


def test_a_folder_that_is_not_a_built_book_or_an_unknown_page_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(pagecheck.PageCheckError, match="not a built book"):
        pagecheck.book_pages(tmp_path)
    with pytest.raises(pagecheck.PageCheckError, match="no page named nope"):
        pagecheck.book_pages(book(tmp_path, ch1=CLEAN_PAGE), ["nope"])
    assert pagecheck.main([str(tmp_path), "--chromium", "no-such-browser"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no Chromium found (no-such-browser)") and err.count("\n") == 1
    assert pagecheck.main([str(tmp_path), "--width", "-5"]) == 2  # refused before any browser starts
    err = capsys.readouterr().err
    assert "--width" in err and "out of range" in err and err.count("\n") == 1


def test_a_page_that_never_reported_is_an_error_not_a_clean_page() -> None:
    with pytest.raises(pagecheck.PageCheckError, match="did not report"):
        pagecheck.parse_report("<html><body></body></html>", "ch1.html", 400)
    dom = '<pre id="msgcore-pagecheck">{"width": 400, "findings": [{"kind": "nan", "where": "a &amp; b", ' \
          '"detail": "x"}]}</pre>'
    assert pagecheck.parse_report(dom, "ch1.html", 400) == [pagecheck.Finding("ch1.html", 400, "nan", "a & b", "x")]


@pytest.mark.skipif(not HAS_CHROMIUM, reason="needs Chromium")
def test_chromium_finds_each_defect_at_a_phone_width_and_nothing_on_a_clean_page(tmp_path: Path) -> None:
    findings = pagecheck.check_book(book(tmp_path, bad=BAD_PAGE, clean=CLEAN_PAGE), widths=(400,))
    assert {f.page for f in findings} == {"bad.html"}
    kinds = {f.kind for f in findings}
    assert [f.where.split(" (")[0] for f in findings if f.kind == "wide table"] == ["table 1", "table 2"]  # the folded one too
    assert {"wide table", "literal backticks", "nan", "machine path", "code soft-wraps"} <= kinds
    paths = [f.detail for f in findings if f.kind == "machine path"]
    assert sorted(paths) == ["/home/someone/.cache/msgcore", "~/.cache/runs/abc"] and findings[0].width == 400
