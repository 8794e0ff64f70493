"""`rollart bench`: the registry is the one list of benchmarks (every one listed, each module importable with a
`run`), the command runs them from the checkout it sits in and says where they live without one, and a misplaced
option, a bad count or a study without its file exits 2 with a message naming it, before any benchmark runs."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import registry
from rollart.cli import main
from rollart.cli.commands import bench as bench_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, says", [
    (["bench", "weights", "--nodes", "2"], "--nodes applies to 'rollart bench chaos' only, not 'weights'"),
    (["bench", "rollout", "--piece", "next"], "--piece applies to 'rollart bench staleness|algos' only"),
    (["bench", "reward", "--jobs", "0"], "argument --jobs: takes a count ≥ 1, not 0"),
    (["bench", "chaos", "--nodes", "two"], "argument --nodes: takes a count ≥ 1, not 'two'"),
    (["bench", "staleness", "--piece", "next"], "needs --json PATH"),
    (["bench", "nosuch"], "unknown benchmark 'nosuch'"),
    (["bench"], "no benchmark named; choose one of: engine, weights"),
])
def test_a_misplaced_option_is_refused_naming_it(argv, says, capsys):
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_every_benchmark_module_is_in_the_registry_and_has_a_run():
    """A module under benchmarks/ with a `run(quick, ...)` is a benchmark; the registry lists each one (the
    vLLM and multi-job variants are reached through their parent's option)."""
    variants = {"benchmarks.engine_vllm": "engine", "benchmarks.reward_multijob": "reward"}
    with_run = set()
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in tree.body):
            with_run.add(f"benchmarks.{path.stem}")
    listed = {b.module for b in registry.BENCHMARKS}
    assert with_run - set(variants) == listed
    names = [b.name for b in registry.BENCHMARKS]
    assert len(names) == len(set(names)) and {variants[v] for v in variants} <= set(names)
    for bench in registry.BENCHMARKS:  # the summary is one line, and each module really loads (no Ray, no run)
        assert bench.summary and "\n" not in bench.summary
        assert callable(importlib.import_module(bench.module).run)


def test_list_and_help_show_every_benchmark_with_its_line(capsys):
    assert main(["bench", "list"]) == 0
    listed = capsys.readouterr().out
    assert main(["bench", "--help"]) == 0
    helped = capsys.readouterr().out
    for bench in registry.BENCHMARKS:
        line = next(line for line in listed.splitlines() if line.split()[0] == bench.name)
        assert bench.summary in line
        assert bench.summary in helped
    assert "--nodes N" in helped and "chaos: run on a loopback Ray cluster" in helped


def test_two_benchmarks_sharing_an_option_must_declare_it_alike(monkeypatch):
    jobs = registry.Option("--jobs", "N jobs", type=registry.count, metavar="N")
    other = registry.Option("--jobs", "N jobs", metavar="N")
    monkeypatch.setattr(registry, "BENCHMARKS", (registry.Benchmark("a", "benchmarks.a", "a", (jobs,)),
                                                 registry.Benchmark("b", "benchmarks.b", "b", (jobs,))))
    assert registry.options()["jobs"] == (jobs, ("a", "b"))
    monkeypatch.setattr(registry, "BENCHMARKS", (registry.Benchmark("a", "benchmarks.a", "a", (jobs,)),
                                                 registry.Benchmark("b", "benchmarks.b", "b", (other,))))
    with pytest.raises(ValueError, match="declare --jobs differently"):
        registry.options()


def test_the_command_finds_the_checkout_it_runs_from():
    assert bench_command.checkout_root() == ROOT


def test_an_installed_rollart_without_a_checkout_says_where_benchmarks_live(tmp_path, monkeypatch, capsys):
    installed = tmp_path / "site-packages" / "rollart"
    installed.mkdir(parents=True)
    monkeypatch.setattr(bench_command.rollart, "__file__", str(installed / "__init__.py"))
    assert bench_command.checkout_root() is None
    assert main(["bench", "list"]) == 2
    err = capsys.readouterr().err
    assert "benchmarks/ folder" in err and str(installed) in err and "pip install -e ." in err


def test_the_wheel_does_not_ship_the_benchmarks():
    """The package list setuptools builds from pyproject.toml's `packages.find`."""
    import tomllib

    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(where=str(ROOT), include=find["include"], exclude=find.get("exclude", ()))
    assert "rollart" in packages and "rollart.cli.commands" in packages
    assert not [p for p in packages if p.split(".")[0] != "rollart"]


def test_rollart_bench_runs_from_anywhere_without_the_checkout_on_the_path():
    """As from an editable install: rollart is importable by a finder that maps only the package, the checkout
    root is not on sys.path (no PYTHONPATH, cwd elsewhere), so `benchmarks` is not importable until the command
    puts the root it found on the path."""
    code = f"""
import importlib.util, sys
sys.path = [p for p in sys.path if p not in ("", ".", {str(ROOT)!r})]
spec = importlib.util.spec_from_file_location("rollart", {str(ROOT / "rollart" / "__init__.py")!r},
                                              submodule_search_locations=[{str(ROOT / "rollart")!r}])
sys.modules["rollart"] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print("before:", importlib.util.find_spec("benchmarks"))
from rollart.cli import main
sys.exit(main(["bench", "list"]))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd="/", env={"PATH": str(Path(sys.executable).parent)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "before: None" in out.stdout and "staleness" in out.stdout


def test_every_benchmark_has_a_smoke_run_its_options_allow():
    """`make bench-smoke` runs every registered benchmark with its `smoke` arguments: each parses, and names
    only options its benchmark declares (a new benchmark joins with `--quick`, or a smaller form it declares)."""
    from benchmarks.cli import build_parser

    parser = build_parser()
    declared = registry.options()
    for bench in registry.BENCHMARKS:
        args = parser.parse_args([bench.name, *bench.smoke, "--json", "/nonexistent/x.json"])
        assert args.name == bench.name and bench.smoke_timeout_s > 0
        for dest, (_, owners) in declared.items():
            if getattr(args, dest) is not None:
                assert bench.name in owners, f"{bench.name}'s smoke run gives {dest}, an option of {owners}"


def test_the_smoke_run_counts_a_benchmark_as_done_only_when_it_ran_to_its_end(tmp_path):
    from benchmarks.smoke import verdict

    chaos = registry.by_name()["chaos"]
    path = tmp_path / "chaos.json"
    assert verdict(chaos, None, path).startswith("did not finish within")
    assert verdict(chaos, 1, path) == "exited 1"
    assert verdict(chaos, 0, path).startswith("wrote no readable JSON")
    path.write_text('{"bench": "async", "ratios": {"x": 1}}')
    assert verdict(chaos, 0, path).startswith("its JSON does not name it")
    path.write_text('{"bench": "chaos", "ratios": {"run_completed": 0.0, "trajectories_lost": 0.0}}')
    assert verdict(chaos, 0, path) == "ratio run_completed = 0.0, expected 1.0"
    path.write_text('{"bench": "chaos", "ratios": {"run_completed": 1.0, "trajectories_lost": 0.0, '
                    '"trajectories_duplicated": 0.0}}')
    assert verdict(chaos, 0, path) == ""
