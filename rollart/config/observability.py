"""The `observability` section: what a run records and shows (metric sinks, live progress, the timeline, the
report's samples, logs).

In: `Section` and the trust markers (`base`), the bounds (`bounds`). Out: `ObservabilityConfig`.

Guarantee: a sink that sends data elsewhere (W&B, MLflow) is marked, so `rollart eval` does not take it from a
run directory's config unless given again.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollart.config.base import TRUST_NETWORK, Section
from rollart.config.bounds import DAY_S


class ObservabilityConfig(Section):
    """What a run records and shows: metric sinks, live progress, the timeline, the report, logs."""

    tensorboard: bool = Field(True, description="write TensorBoard event files to RUN_DIR")
    tensorboard_flush_s: float = Field(10.0, gt=0, le=DAY_S, description="how often TensorBoard events hit disk")
    wandb_project: str = Field(
        "", description="log to W&B under this project (needs `wandb` installed)",
        json_schema_extra=TRUST_NETWORK,
    )
    wandb_entity: str = Field(
        "", description="W&B entity (team or user); empty = your default",
        json_schema_extra=TRUST_NETWORK,
    )
    mlflow_uri: str = Field(
        "", description="log to this MLflow tracking URI (needs `mlflow` installed)",
        json_schema_extra=TRUST_NETWORK,
    )
    mlflow_experiment: str = Field("rollart", description="MLflow experiment name")
    progress: Literal["rich", "plain", "quiet"] = Field(
        "rich", description="live progress: rich (a bar on a TTY, plain lines otherwise), plain lines, quiet"
    )
    timeline: bool = Field(True, description="write RUN_DIR/timeline.json, a Chrome trace of every trajectory")
    timeline_max_trajectories: int = Field(
        5000, ge=0, le=10_000_000, description="trajectories kept in timeline.json; later ones are counted, not drawn"
    )
    gantt_rows: int = Field(48, ge=1, le=100_000, description="the report's Gantt chart draws the last N trajectories")
    samples_per_domain: int = Field(
        3, ge=0, le=1000, description="trajectories of each domain's trained batch written as text every step to "
        "RUN_DIR/samples.jsonl, TensorBoard's text tab and the report (`rollart samples RUN_DIR`): 1 = the "
        "median by reward, 2 = the worst and the best, 3 = worst, median and best, more = spread between them; "
        "0 = none"
    )
    sample_max_chars: int = Field(
        4000, ge=100, le=1_000_000, description="characters kept of each prompt or response text of a sample (the "
        "rest is cut, and the cut said)"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="level of rollart's logs, in the driver and in every Ray worker process of the run"
    )
