"""The package's layers (docs/architecture.md, "Layers"): every import, at module level or inside a
function, points to the same layer or below. An import upward is what made the report and the
algorithms one circle of fifteen files."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PITA = Path(__file__).resolve().parent.parent / "pita"
# low to high; a module may import its own layer and those below
LAYERS = [
    {"core"},
    {"models", "datasets", "generation", "guidance", "rewards", "losses", "eval", "tracking", "training"},
    {"algos"},
    {"plans", "config"},
    {"report"},
    {"sweep", "cli", "setup_check", "__init__"},
    {"entry", "__main__"},
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _part(module: str) -> str:
    """pita.report.plots -> report; pita -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "pita":  # from pita import sweep: the submodule named
                out += [(f"pita.{a.name}", node.lineno) for a in node.names]
            else:
                out.append((node.module, node.lineno))
    return [(m, n) for m, n in out if m == "pita" or m.startswith("pita.")]


def test_every_module_belongs_to_a_layer():
    tops = {p.stem if p.is_file() else p.name for p in PITA.iterdir()
            if (p.is_file() and p.suffix == ".py") or (p / "__init__.py").exists()}
    assert tops <= set(RANK), f"add these to LAYERS (and to docs/architecture.md): {sorted(tops - set(RANK))}"


def test_imports_point_downward_only():
    upward = []
    for f in sorted(PITA.rglob("*.py")):
        rel = f.relative_to(PITA.parent).with_suffix("")
        src = _part(".".join(rel.parts[:-1]) if rel.name == "__init__" and len(rel.parts) > 1 else ".".join(rel.parts))
        for module, line in _imports(f):
            dst = _part(module)
            if RANK[dst] > RANK[src]:
                upward.append(f"{f.relative_to(PITA.parent)}:{line} ({src}) imports {module} ({dst})")
    assert not upward, "\n".join(upward)


def test_the_report_and_the_tracker_load_no_algorithm():
    code = ("import sys; import pita.report.report, pita.report.results, pita.report.plots, pita.tracking; "
            "print(sorted(m for m in sys.modules if m.startswith('pita.algos')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
