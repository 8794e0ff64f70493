"""The run-directory contract: where every artefact of a training run lives, named once.

In: a run directory path. Out: `RunPaths`, the one place these file names are spelled:

    RUN_DIR/config.yaml        resolved config (`config_loader.write_resolved`)
    RUN_DIR/metrics.jsonl      one JSON object per log call: {"step", "wall_s", "time", "<ns>/<name>": number}
    RUN_DIR/samples.jsonl      a few trained trajectories per domain and step, as text (`observability.samples`)
    RUN_DIR/timeline.json      Chrome trace of every trajectory's life (opens in Perfetto)
    RUN_DIR/ledger.jsonl       every trajectory's moves, one JSON object each: {"time", "id", "group", "domain",
                               "fate": running|ready|trained|aborted|failed|stale, "reason", "digest", "batch"}
    RUN_DIR/summary.json       {eval_first, eval_last, eval_first_by_domain, eval_last_by_domain, steps, wall_s, ...}
    RUN_DIR/tensorboard/       TensorBoard event files
    RUN_DIR/checkpoints/       trainer checkpoints (their own layout: `rollart.trainer.checkpoint`)
    RUN_DIR/report/index.html  `rollart report RUN_DIR`

Why here and not in the observability plane, which writes most of these: the trainer (checkpoints), the
config loader (config.yaml) and the commands read or write them too, and a plane may not import another
plane, nor the config loader any plane. A module at the bottom of the import layers (beside `types`,
importing nothing of rollart) is one that every one of them may import.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @classmethod
    def of(cls, run_dir: str | Path) -> RunPaths:
        return cls(Path(run_dir))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def samples(self) -> Path:
        return self.root / "samples.jsonl"

    @property
    def timeline(self) -> Path:
        return self.root / "timeline.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def report(self) -> Path:
        return self.report_dir / "index.html"
