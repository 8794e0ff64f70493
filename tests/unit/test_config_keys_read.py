"""Every config key is read by a production code path: no setting is accepted and then silently ignored.

Production: the `rollart` package but the cluster twin (`sim/`), the planner (`plan/`), the benchmarks and
the schema's own description (`config/explain.py`) and loader (`config/loader.py`), which walk every key
generically. A key is read when its name is accessed as an attribute there (or named as a string, for a
`getattr` over field names) — a static look at the code, so a name that production code also uses for a
function or method is ambiguous: such a key counts as read only through its section (`cfg.rollout.remap`,
`rollout.remap`), or where `READ_AT` says (checked) — keys of a named entry (`domains.<d>.pool`) and of the
top level have no section name to be read through. The only keys a
run may leave to the twin and the planner are the declared episode profile's (`domains.<d>.profile`: what
`rollart sim` simulates and `rollart plan` plans for; a run with `rollout.remap` reads its means).
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from rollart.config.explain import ENTRY, schema_keys

PACKAGE = Path(__file__).resolve().parents[2] / "rollart"
NOT_PRODUCTION_DIRS = {"sim", "plan"}
NOT_PRODUCTION_FILES = {"config/explain.py", "config/loader.py"}

# keys whose name production code also gives a function: where each is read (module, relative to rollart/)
READ_AT = {
    "resume": "job/system.py",
    "domains.<name>.demonstrations": "job/warm_start.py",
    "domains.<name>.max_turns": "envs/manager.py",
    "domains.<name>.max_total_tokens": "envs/manager.py",
    "domains.<name>.profile.prompt_tokens.mean": "observability/profile.py",
    "domains.<name>.profile.obs_tokens.mean": "observability/profile.py",
    "observability.tensorboard": "observability/logger.py",
    # `samples` is also RunPaths.samples (samples.jsonl); `window` also Admission.window()
    "domains.<name>.inject.reset_latency.samples": "envs/injection.py",
    "domains.<name>.inject.step_latency.samples": "envs/injection.py",
    "rollout.circuit_breaker.window": "control/breaker.py",
    # also the shaping function algo/shaping.overlong_penalty
    "train.overlong_penalty": "algo/batch.py",
}
FOR_THE_TWIN_AND_PLANNER = "domains.<name>.profile."


# Each module's names, found in a fresh interpreter: CPython 3.11's `ast.parse` can fail with "AST constructor
# recursion depth mismatch" on some files once an earlier test in the same process has hit its recursion
# limit; a child process starts clean.
_SCAN = """
import ast, json, sys
from pathlib import Path
root = Path(sys.argv[1])
def tail(e):
    return e.attr if isinstance(e, ast.Attribute) else e.id if isinstance(e, ast.Name) else None
out = {}
for path in sorted(root.rglob("*.py")):
    reads, functions, through = set(), set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
            reads.add(node.attr)
            through.add((tail(node.value), node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            reads.add(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.add(node.name)
    out[str(path.relative_to(root))] = [sorted(reads), sorted(functions), sorted(map(list, through), key=str)]
print(json.dumps(out))
"""


@lru_cache(maxsize=None)
def _scan() -> dict[str, list]:
    done = subprocess.run([sys.executable, "-c", _SCAN, str(PACKAGE)], capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout)


def production_modules() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] not in NOT_PRODUCTION_DIRS and str(rel) not in NOT_PRODUCTION_FILES:
            out.append(str(rel))
    return out


def reads_and_functions(modules: list[str]) -> tuple[set[str], set[str], set[tuple[str | None, str]]]:
    """Names accessed (attributes, identifier strings), names defined as functions (not the schema's own
    validators), and (what an attribute was read from, the attribute) pairs in `modules`."""
    reads, functions, through = set(), set(), set()
    for module in modules:
        module_reads, module_functions, module_through = _scan()[module]
        reads.update(module_reads)
        if not module.startswith("config/"):  # the schema's own validators
            functions.update(module_functions)
        through.update((a, b) for a, b in module_through)
    return reads, functions, through


def unread_keys(modules: list[str]) -> list[str]:
    reads, functions, through = reads_and_functions(modules)
    unread = []
    for doc in schema_keys():
        if doc.section:
            continue
        *parents, name = doc.key.split(".")
        if name in functions:  # ambiguous: read through its section, or where READ_AT says
            if parents and parents[-1] != ENTRY and (parents[-1], name) in through:
                continue
            where = READ_AT.get(doc.key)
            if where is None or where not in modules or name not in reads_and_functions([where])[0]:
                unread.append(doc.key)
        elif name not in reads:
            unread.append(doc.key)
    return unread


def test_every_config_key_is_read_by_a_production_code_path() -> None:
    unread = [k for k in unread_keys(production_modules()) if not k.startswith(FOR_THE_TWIN_AND_PLANNER)]
    assert unread == [], (
        f"config keys no production code path reads: {unread} — wire each one, or remove it (a setting that is "
        "accepted and ignored misleads); a key whose name is also a function's needs its place in READ_AT")


def test_the_check_catches_keys_only_the_twin_reads() -> None:
    """Re-mapping read by the twin alone, as it once was (before `rollart train` did it), is caught: the
    twin's modules do not count."""
    twin_only = [m for m in production_modules() if m != "loop/remapping.py"] + ["sim/system.py", "sim/estimate.py"]
    assert {"rollout.remap", "rollout.remap_drift", "rollout.remap_min_episodes"} <= set(unread_keys(
        [m for m in twin_only if not m.startswith("sim/")]))


def test_the_ambiguous_keys_are_read_where_they_say() -> None:
    modules = production_modules()
    _, functions, _ = reads_and_functions(modules)
    for key, module in READ_AT.items():
        name = key.rsplit(".", 1)[-1]
        assert module in modules and name in reads_and_functions([module])[0], (key, module)
        assert name in functions, f"{key}: no longer ambiguous, drop it from READ_AT"
