"""The library's layers import one way: core -> models -> foundations -> experiments (-> notebooks).

No chapter's experiments import another chapter's; what two chapters share lives in `msgcore.foundations` or below.
Imports are read from the source (every `import` and `from ... import`, at any depth, lazy ones included).
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "msgcore"
LAYERS = {"core": 0, "models": 1, "foundations": 2, "experiments": 3, "top": 4}
# Above every layer: the command lines, the runners (local and offline GPU), the benchmarks, the chapters'
# registry and the chapters' GPU cost estimates, which read the book's notebooks (they may import anything, and are
# not checked).
TOP = ("msgcore.book", "msgcore.bench", "msgcore.bench_peers", "msgcore.__main__", "msgcore.chapters",
       "msgcore.costs", "msgcore.offline")
# The upward imports the core makes, and why.
UPWARD = {("msgcore.trainer", "msgcore.models"): "load_model looks a checkpoint's class up in the model registry",
          ("msgcore.retrieval", "msgcore.models.marge"): "MARGE's retrieval and batch construction build its batches",
          ("msgcore.scoreboard", "msgcore.chapters"): "a results file is stale or current against the chapters' "
                                                      "recipes (lazily, when the scoreboard renders it)"}


def layer_of(module: str) -> str:
    """'msgcore.models.trice' -> 'models'; any other msgcore module is the core (the runner `msgcore.book` and the
    benchmarks sit above the chapters and are not checked here)."""
    if module in TOP:
        return "top"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


def imported_modules(path: Path) -> set[str]:
    """Every msgcore module a file imports, wherever the import statement sits."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{alias.name}" for alias in node.names}  # "from msgcore.experiments import trice"
    return {m for m in out if m.split(".")[0] == "msgcore"}


def library_files():
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        if module in TOP or module.startswith("msgcore.experiments.__main__"):
            continue  # above every layer
        yield module, path


def is_module(name: str) -> bool:
    parts = name.split(".")
    return (PACKAGE.parent.joinpath(*parts).with_suffix(".py").is_file()
            or (PACKAGE.parent.joinpath(*parts) / "__init__.py").is_file())


@pytest.mark.parametrize("module,path", list(library_files()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_module_imports_only_its_own_layer_and_those_below(module, path):
    mine = layer_of(module)
    for imported in imported_modules(path):
        if not is_module(imported) or imported.startswith(module + ".") or (module, imported) in UPWARD:
            continue  # a name imported from a module ("msgcore.recipes.RunResult"), a package's own part, or UPWARD
        theirs = layer_of(imported)
        assert LAYERS[theirs] <= LAYERS[mine], f"{module} ({mine}) imports {imported} ({theirs})"
        if mine in ("experiments", "models") and theirs == mine and imported != f"msgcore.{mine}":
            assert imported == module, f"{module} imports {imported}: one paper's code imports another's"


def test_the_check_sees_a_lazy_cross_chapter_import(tmp_path):
    source = tmp_path / "chapter.py"
    source.write_text("def f():\n    from msgcore.experiments.trice import encode_task\n    from msgcore.experiments import "
                      "mixrep\n")
    assert {"msgcore.experiments.trice", "msgcore.experiments.mixrep"} <= imported_modules(source)
    assert layer_of("msgcore.foundations.denoiser") == "foundations" and layer_of("msgcore.recipes") == "core"
