"""Read the built book as its readers do: every page in headless Chromium at a desktop and a phone width.

    python -m msgcore.pagecheck runs/<run>/_build/html            # 1280 and 400 px; exit 1 on any finding
    python -m msgcore.pagecheck HTML --width 400 --page scoreboard

Each page is loaded from a scratch copy of the HTML folder with one script added, which measures the laid-out page
and reports, per width:

- a table wider than its column (it would scroll sideways, or run off the page), and a table whose first column is
  cut off, folded tables (`<details>`) unfolded as a reader would;
- a page that scrolls sideways as a whole (an equation, a figure or a line of text wider than the screen);
- source code that soft-wraps (its indentation is lost) instead of scrolling;
- Markdown backticks shown literally in text;
- `nan` in text (a missing value should print as a dash or say why);
- a path of the machine that built the book in an output (`/home/...`, `/root/...`, `/tmp/...`, `/work/...`,
  `~/...`); the prose may name a default folder.

Chromium is the only thing it needs (Debian: `apt-get install chromium`; or `--chromium PATH`). It reads nothing but
the pages and writes only its scratch copy.
"""
from __future__ import annotations

import argparse
import html as html_lib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from msgcore.options import OneLineParser, whole
from msgcore.utils import MsgcoreError

WIDTHS = (1280, 400)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
# Flags for a headless start on a machine with no network (each disables a background connection it would try).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--virtual-time-budget=10000", "--dump-dom")
RESULT_ID = "msgcore-pagecheck"
MARKER = re.compile(rf'<pre id="{RESULT_ID}">(.*?)</pre>', re.S)

# The measuring script, run once the page (and MathJax) has settled. Findings are {"kind", "where", "detail"}.
CHECK_SCRIPT = r"""
<script>
window.addEventListener("load", () => setTimeout(() => {
  const findings = [];
  const add = (kind, where, detail) => findings.push({kind, where, detail});
  const vw = document.documentElement.clientWidth;
  const main = document.querySelector("main") || document.body;
  const label = (el) => (el.innerText || "").trim().replace(/\s+/g, " ").slice(0, 60);
  const visible = (el) => el.getClientRects().length > 0;
  document.querySelectorAll("details").forEach((folded) => { folded.open = true; });  // what a reader unfolds
  main.querySelectorAll("table").forEach((table, i) => {
    if (!visible(table)) return;
    const box = table.getBoundingClientRect();
    const head = label(table.querySelector("tr") || table);
    if (table.scrollWidth > table.clientWidth + 1 || box.right > vw + 1 || box.left < -1) {
      add("wide table", `table ${i + 1} (${head})`, `${Math.max(table.scrollWidth, Math.round(box.width))} px in a ${Math.min(table.clientWidth || vw, vw)} px column`);
    }
    const key = table.querySelector("tr > :first-child");
    let clip = table;
    if (key) {
      const right = key.getBoundingClientRect().right;
      if (right > Math.min(clip.getBoundingClientRect().right, vw) + 1) add("clipped key column", `table ${i + 1} (${head})`, `its first column ends at ${Math.round(right)} px`);
    }
  });
  if (document.documentElement.scrollWidth > vw + 1) {
    let widest = null;
    main.querySelectorAll("*").forEach((el) => {
      const r = el.getBoundingClientRect();
      if (r.right > vw + 1 && el.children.length === 0 && (!widest || r.right > widest.getBoundingClientRect().right)) widest = el;
    });
    add("page scrolls sideways", widest ? `${widest.tagName.toLowerCase()} (${label(widest)})` : "page", `${document.documentElement.scrollWidth} px on a ${vw} px screen`);
  }
  main.querySelectorAll("div[class*='highlight-python'] pre, div[class*='highlight-ipython'] pre, .cell_input pre").forEach((pre, i) => {
    const ws = getComputedStyle(pre).whiteSpace;
    if (visible(pre) && ws !== "pre" && pre.scrollWidth >= pre.clientWidth - 1 && /\n\s+\S/.test(pre.textContent) && pre.textContent.split("\n").some((line) => line.length * 7 > pre.clientWidth)) {
      add("code soft-wraps", `code block ${i + 1} (${label(pre)})`, `white-space: ${ws}`);
    }
  });
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  const inside = (node, selector) => node.parentElement && node.parentElement.closest(selector);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const text = node.textContent;
    if (inside(node, "script, style")) continue;
    const snippet = text.trim().replace(/\s+/g, " ").slice(0, 80);
    const code = inside(node, "pre, code, .cell_input, .highlight, mjx-container");
    if (!code && text.includes("`")) add("literal backticks", snippet, "Markdown shown as text");
    if (!inside(node, ".cell_input, div[class*='highlight-python'], div[class*='highlight-ipython']") && /(^|[^A-Za-z_.'"])(nan|NaN)(?![A-Za-z_(])/.test(text)) add("nan", snippet, "a missing value printed as nan");
    const output = inside(node, ".cell_output, .output");
    const path = output && text.match(/(^|[\s'"(=:])((\/(home|root|tmp|work|Users)\/|~\/)[^\s'")]*)/);
    if (path) add("machine path", snippet, path[2]);  // in outputs: the prose may name a default folder
  }
  const out = document.createElement("pre");
  out.id = "msgcore-pagecheck";
  out.textContent = JSON.stringify({width: vw, findings});
  document.body.appendChild(out);
}, 2000));
</script>
"""


class PageCheckError(MsgcoreError):
    """The check could not run: no Chromium, no built book, a page that did not report."""


@dataclass(frozen=True)
class Finding:
    page: str   # the page's path inside the HTML folder
    width: int  # the screen width it was read at, px
    kind: str   # "wide table", "clipped key column", "page scrolls sideways", "code soft-wraps", ...
    where: str  # which element, by its first words
    detail: str

    def line(self) -> str:
        return f"{self.page} @ {self.width} px: {self.kind}: {self.where}: {self.detail}"


def find_chromium(given: str | None = None) -> str:
    """The Chromium executable: `given`, or the first of CHROMIUM_NAMES on PATH; a one-line error otherwise."""
    found = shutil.which(given) if given else next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)
    if not found:
        raise PageCheckError(f"no Chromium found ({given or ', '.join(CHROMIUM_NAMES)}): install it (Debian: "
                             f"apt-get install chromium) or pass --chromium PATH")
    return found


def book_pages(html_dir: Path, only: list[str] | None = None) -> list[Path]:
    """The book's content pages under `html_dir` (not the index, search or generated pages), or those whose stem
    is in `only`; a one-line error when there are none."""
    if not (html_dir / "index.html").is_file():
        raise PageCheckError(f"{html_dir} is not a built book (no index.html): build it first "
                             f"(python -m msgcore.book run ... --build)")
    pages = sorted(p.relative_to(html_dir) for p in html_dir.rglob("*.html")
                   if not {"_static", "_sources", "_images"} & set(p.relative_to(html_dir).parts)
                   and p.name not in ("index.html", "search.html", "genindex.html"))
    if only:
        unknown = sorted(set(only) - {p.stem for p in pages})
        if unknown:
            raise PageCheckError(f"no page named {', '.join(unknown)} (pages: {', '.join(p.stem for p in pages)})")
        pages = [p for p in pages if p.stem in only]
    return pages


def parse_report(dom: str, page: str, width: int) -> list[Finding]:
    """The findings the page's script wrote into the dumped DOM; an error when it wrote none."""
    match = MARKER.search(dom)
    if not match:
        raise PageCheckError(f"{page} @ {width} px: the page did not report (did it load?)")
    report = json.loads(html_lib.unescape(match.group(1)))
    return [Finding(page, width, f["kind"], f["where"], f["detail"]) for f in report["findings"]]


def check_page(chromium: str, path: Path, page: str, width: int, profile: Path) -> list[Finding]:
    """Load one prepared page at one width and return what its script found."""
    command = [chromium, *CHROMIUM_FLAGS, f"--window-size={width},900", f"--user-data-dir={profile}",
               path.resolve().as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise PageCheckError(f"{page} @ {width} px: Chromium exited {done.returncode}: "
                             f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    return parse_report(done.stdout, page, width)


def check_book(html_dir: str | Path, widths=WIDTHS, only: list[str] | None = None,
               chromium: str | None = None) -> list[Finding]:
    """Every finding on every content page of the built book at each width (see the module docstring)."""
    html_dir = Path(html_dir)
    browser = find_chromium(chromium)
    pages = book_pages(html_dir, only)
    findings = []
    with tempfile.TemporaryDirectory(prefix="pagecheck-") as scratch:
        copy = Path(scratch) / "html"
        shutil.copytree(html_dir, copy, ignore=shutil.ignore_patterns("_sources", "*.ipynb"))
        for page in pages:
            target = copy / page
            text = target.read_text(encoding="utf-8")
            target.write_text(text.replace("</body>", CHECK_SCRIPT + "</body>", 1), encoding="utf-8")
            for width in widths:
                findings += check_page(browser, target, page.as_posix(), width, Path(scratch) / "profile")
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m msgcore.pagecheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("html", type=Path, help="the built book's HTML folder (…/_build/html)")
    parser.add_argument("--width", type=whole(200, 4000), action="append",
                        help="screen widths in px, 200 to 4000 (default 1280 and 400)")
    parser.add_argument("--page", action="append", help="only these pages, by stem (e.g. scoreboard)")
    parser.add_argument("--chromium", help="the Chromium executable (default: found on PATH)")
    args = parser.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        findings = check_book(args.html, tuple(args.width or WIDTHS), args.page, args.chromium)
    except (PageCheckError, OSError, subprocess.TimeoutExpired) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for finding in findings:
        print(finding.line())
    pages = len(book_pages(args.html, args.page))
    print(f"{len(findings)} findings on {pages} pages at {', '.join(map(str, args.width or WIDTHS))} px")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
