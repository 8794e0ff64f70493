"""The run-directory contract: where every artefact of a run lives, and the metric namespaces.

In: a run directory path. Out: `RunPaths`, the one place the file names below are spelled:

    RUN_DIR/config.yaml        resolved config (written by the driver with config_loader.write_resolved)
    RUN_DIR/metrics.jsonl      one JSON object per log call: {"step", "wall_s", "time", "<ns>/<name>": number}
    RUN_DIR/timeline.json      Chrome trace of every trajectory's life (opens in Perfetto)
    RUN_DIR/summary.json       {eval_first, eval_last, eval_first_by_domain, eval_last_by_domain, steps, wall_s, ...}
    RUN_DIR/tensorboard/       TensorBoard event files
    RUN_DIR/checkpoints/       trainer checkpoints
    RUN_DIR/report/index.html  `rollart report RUN_DIR`

Guarantees: `check_metric_name` accepts exactly `<namespace>/<name>` with a namespace of `NAMESPACES`, so
a typo fails at the first step with the list of valid namespaces instead of producing a silent new curve.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Metric namespaces (issue 8 §1). `weights/*` carries what a WeightPublisher returns (bytes, buckets).
NAMESPACES: tuple[str, ...] = (
    "time", "rollout", "env", "eval", "reward", "train", "buffer", "pools", "system", "weights",
)
RESERVED_KEYS = ("step", "wall_s", "time")


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


def check_metric_name(name: str) -> None:
    """Raise ValueError unless `name` is `<namespace>/<name>` with a known namespace."""
    ns, sep, rest = name.partition("/")
    if not sep or not rest or ns not in NAMESPACES:
        raise ValueError(
            f"metric name '{name}' must be '<namespace>/<name>' with a namespace of {list(NAMESPACES)}"
        )
