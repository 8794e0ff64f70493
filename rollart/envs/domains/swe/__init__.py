"""The SWE-style repair domain: generated Python packages with a seeded bug, fixed with tools.

- `generator.generate(seed, difficulty, families)` → `RepairTask` (package files with the bug and visible
  tests, hidden cases, the bug, its fix); `templates` and `mutations` are what tasks are made of.
- `patch` — unified diffs (the expert's fix, the `apply_patch` tool); `expert.expert_patch(task)`.
- `scoring.score(files, package, hidden, run)` — the hidden cases run in a fresh sandbox, judged here;
  `hidden_harness.py` is the program that runs them there.
"""
