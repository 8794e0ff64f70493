"""rollart.job — the composition root of one job: the only package that imports several planes.

- `driver`: the entry points (`train`, `evaluate`, `warm_start_checkpoint`) that read like the algorithm.
- `preflight`: what a config names outside itself, checked before anything starts.
- `system`: every plane's objects built from a `RunConfig` and wired together (the RL loop's hands).
- `recorder`: what a run leaves behind and shows while it runs.
- `warm_start`: the supervised warm start on expert demonstrations before RL.
- `evaluation`: each domain's validation score at the weights the engines serve.
- `lending`: the trainer's devices lent to generation while it waits for a batch (`train.elastic_generation`).

Above it only the CLI, the cluster twin and the planner; no plane imports it.
"""
