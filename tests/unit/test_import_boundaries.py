"""The one rule of docs/architecture.md §3 stays true: import-linter's contracts (.importlinter) hold for the real
package and the benchmarks, and the same contracts catch a plane that imports another plane, rollart importing a
benchmark, and an import cycle (each checked on a temp copy)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    # PYTHONPATH=cwd puts the package under cwd ahead of the installed (editable) one
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(cwd)}
    return subprocess.run([str(LINT), "--no-cache", "--config", str(cwd / ".importlinter")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_package_keeps_its_layers():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def _lint_with(tmp_path: Path, module: str, source: str) -> subprocess.CompletedProcess:
    """import-linter on a temp copy of rollart and benchmarks with one extra module `module` (a path from the
    repository root, e.g. "rollart/reward/_x.py")."""
    shutil.copytree(ROOT / "rollart", tmp_path / "rollart", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks",
                    ignore=lambda d, names: [n for n in names if not (n.endswith(".py") or Path(d, n).is_dir())
                                             or n == "__pycache__"])
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    (tmp_path / module).write_text(source)
    return _lint(tmp_path)


def test_a_plane_importing_another_plane_is_caught(tmp_path):
    out = _lint_with(tmp_path, "rollart/reward/_violation.py", "import rollart.inference  # a plane → a plane\n")
    assert out.returncode != 0
    assert "BROKEN" in out.stdout
    assert "rollart.reward._violation -> rollart.inference" in out.stdout


def test_a_lower_layer_importing_a_plane_is_caught(tmp_path):
    out = _lint_with(tmp_path, "rollart/resources/_violation.py", "from rollart.control import buffer\n")
    assert out.returncode != 0
    assert "rollart.resources._violation -> rollart.control" in out.stdout


def test_the_product_importing_a_benchmark_is_caught(tmp_path):
    out = _lint_with(tmp_path, "rollart/cli/commands/_violation.py", "from benchmarks import registry\n")
    assert out.returncode != 0
    assert "Nothing in rollart imports benchmarks BROKEN" in out.stdout
    assert "rollart.cli.commands._violation -> benchmarks.registry" in out.stdout


def test_an_import_cycle_is_caught_even_through_a_lazy_import(tmp_path):
    source = "def later():\n    from benchmarks import engine  # the dispatch back: a cycle\n"
    out = _lint_with(tmp_path, "benchmarks/engine_workloads.py",
                     (ROOT / "benchmarks" / "engine_workloads.py").read_text() + "\n\n" + source)
    assert out.returncode != 0
    assert "No import cycles among sibling modules BROKEN" in out.stdout
    assert ".engine_workloads -> .engine" in out.stdout


def test_the_sandbox_imports_only_config_and_types(tmp_path):
    """The sandbox sits below both planes that use it: importing a plane, or rollart's loaders, is caught."""
    out = _lint_with(tmp_path, "rollart/sandbox/_violation.py", "import rollart.reward\nimport rollart.config.loader\n")
    assert out.returncode != 0
    assert "rollart.sandbox._violation -> rollart.reward" in out.stdout
    assert "rollart.sandbox._violation -> rollart.config.loader" in out.stdout
