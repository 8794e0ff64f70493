"""The driver: rollart's entry points for a training job, an evaluation and a warm-started checkpoint.

- `train(cfg)`: the checks before anything starts (`rollart.job.preflight`), the runtime, the system
  (`rollart.job.system.build_system`) and the recorder, the supervised warm start of a fresh run, then the RL
  loop (`rollart.loop.RLLoop`: the paper's six steps, one loop for every mode); returns the run summary.
- `evaluate(cfg)`: `model.path` scored on every domain's validation split (`rollart.job.evaluation`).
- `warm_start_checkpoint(cfg, out_dir)`: only the warm start (`rollart.job.warm_start`), written as a Hugging
  Face checkpoint.

All three block until done. Whatever stops a job, everything it started is stopped, and what the run did
stays in its run directory (`rollart.job.recorder`); Ctrl-C stops a job within seconds at any phase
(`rollart.base.interrupts`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping

from rollart.base import interrupts
from rollart.config import RunConfig
from rollart.loop import DRIVER_LANE, RLLoop
from rollart.job.preflight import check_config, check_run_dir
from rollart.job.recorder import RunRecorder, resumed_wall_s
from rollart.resources import Runtime
from rollart.job.system import build_system
from rollart.types import Evaluation, Span, TimedMetrics
from rollart.job.warm_start import run_warm_start


def train(cfg: RunConfig) -> dict[str, Any]:
    """Run a whole training job (blocking); returns the run summary (also in RUN_DIR/summary.json)."""
    return interrupts.run(_run_training_job(cfg))


def evaluate(cfg: RunConfig) -> Evaluation:
    """Score `cfg.model.path` on every domain's validation split (blocking)."""
    check_config(cfg)

    async def run() -> Evaluation:
        with Runtime(cfg) as runtime:
            system = build_system(cfg, runtime, with_trainer=False)
            try:
                return await system.evaluate("eval")
            finally:
                await system.close()

    return interrupts.run(run())


def warm_start_checkpoint(cfg: RunConfig, out_dir: str | Path,
                          on_step: Callable[[int, int, Mapping[str, float]], None] | None = None) -> Path:
    """Only the warm start (`train.warm_start` on the trained domains' demonstrations, all weights — a
    `train.lora` is ignored), in this process, written to `out_dir` as a Hugging Face checkpoint: a base
    for LoRA runs (`model.path`) and for benchmarks that compare RL settings from one start."""
    import torch

    from rollart.algo import PolicyObjective
    from rollart.trainer import Trainer

    full = cfg.model_copy(update={"train": cfg.train.model_copy(update={"lora": None})})
    torch.set_num_threads(full.train.threads)
    trainer = Trainer(full, PolicyObjective.from_config(full.train))
    run_warm_start(full, trainer, trainer.model_path, on_step)
    out = Path(out_dir)
    trainer.export(out)
    return out


async def _run_training_job(cfg: RunConfig) -> dict[str, Any]:
    check_config(cfg)  # before anything starts
    check_run_dir(cfg)
    started_at = time.time()
    with Runtime(cfg) as runtime:
        system = build_system(cfg, runtime)
        workers = [n for c in system.inference.values() for n in c.names] + system.trainer.names
        recorder = RunRecorder(cfg, resume_step=system.resumed.step or None, workers=workers,
                               started_at=started_at, incidents=system.incidents,
                               eval_first=system.resumed.eval_first, model_path=system.model_path,
                               wall_before=resumed_wall_s(cfg.run_dir, system.resumed.wall_s) if cfg.resume else 0.0)
        try:
            if system.resumed.step == 0:  # a fresh run: the supervised warm start, one span on the timeline
                began = time.time()
                run_warm_start(cfg, system.trainer, system.model_path, recorder.on_warm_start_step)
                ended = time.time()
                recorder.phase(TimedMetrics({"time/warm_start": ended - began}, Span("warm_start", began, ended,
                                                                                     DRIVER_LANE)))
            await RLLoop(cfg, system, recorder).run()
            recorder.final(await system.metrics())  # the counters as the run ends (a replacement may have landed)
            return recorder.flush()
        finally:
            await system.close()
            recorder.close()
