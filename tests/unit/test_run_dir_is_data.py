"""A run directory is data, never code or a path elsewhere (issue: a tampered run directory ran `id` as root
through `rollart eval`, and resume wrote through its symbolic links).

- `rollart eval RUN_DIR` imports nothing its config.yaml names unless the user gives it again or passes
  --trust-run-config; an env spec must name an env class (`os:system` is refused either way);
- every file rollart writes in a run directory is written without following a symbolic link;
- the pre-check refuses links, a checkpoint link leaving the run, corrupt or truncated state files and a
  step past train.steps, naming the file and the field, before anything starts (no Ray)."""

from __future__ import annotations

import json
import os
import random
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollart.cli import main
from rollart.config.loader import ConfigError, load_config, write_resolved
from rollart.job.preflight import check_config, check_run_dir
from rollart.base.run_dir import RunPaths, UnsafeRunDir
from rollart.trainer.checkpoint import STATE, check_checkpoint_files, step_path
from rollart.trainer.state_files import save_state
from rollart.types import RunState

@dataclass
class Ran:
    returncode: int
    stderr: str


@pytest.fixture
def cli(capsys, monkeypatch, tmp_path):
    """`rollart ARGS` in this process (each refusal here comes before anything starts), from tmp_path."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> Ran:
        code = main(list(args))
        return Ran(code, capsys.readouterr().err)

    return run


def tampered_run(tmp_path: Path, marker: Path) -> Path:
    """A run directory whose config names `os:system` as a domain's env, with a checkpoint to score."""
    run = tmp_path / "run"
    (step_path(run, 1)).mkdir(parents=True)
    (step_path(run, 1) / f"{STATE}.json").write_text("{}")
    RunPaths.of(run).config.write_text(textwrap.dedent(f"""\
        domains:
          x: {{env: "os:system", options: {{command: "id > {marker}"}}}}
        """))
    return run


def test_eval_refuses_the_code_a_run_directory_names_and_runs_nothing(tmp_path, cli):
    marker = tmp_path / "code-ran"
    run = tampered_run(tmp_path, marker)
    refused = cli("eval", str(run))
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "domains.x.env=os:system (imports code)" in refused.stderr
    assert "--trust-run-config" in refused.stderr and "Traceback" not in refused.stderr
    # trusted, or given again: still no env class, so refused before anything runs
    for extra in (["--trust-run-config"], ["domains.x.env=os:system"]):
        again = cli("eval", str(run), *extra)
        assert again.returncode == 2, again.stderr[-2000:]
        assert "names a builtin_function_or_method, not a class" in again.stderr
    assert not marker.exists()


def test_an_env_spec_must_name_a_class_with_the_env_protocol():
    for spec, why in [("os:system", "not a class"), ("json:JSONDecoder", r"has no reset\(\) or step\(\) method")]:
        with pytest.raises(ConfigError, match=why):
            check_config(load_config(None, ["domains.math=null", f"domains.frozenlake.env={spec}"]))


def test_report_reads_a_tampered_config_as_data(tmp_path, cli):
    marker = tmp_path / "code-ran"
    run = tampered_run(tmp_path, marker)
    done = cli("report", str(run))
    assert done.returncode == 0, done.stderr[-2000:]
    assert not marker.exists()


# --- writing without following links -------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    victim = tmp_path / "outside"
    victim.mkdir()
    (victim / "file").write_text("precious\n")
    return victim


def link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def test_the_ledger_is_never_appended_through_a_link(tmp_path, outside):
    from rollart.observability.ledger import LedgerFile

    paths = RunPaths.of(tmp_path / "run")
    link(paths.ledger, outside / "file")  # on main a resume appended 3,153 bytes to the target
    with pytest.raises(UnsafeRunDir, match="ledger.jsonl is a symbolic link"):
        LedgerFile(paths, keep_bytes=0)
    assert (outside / "file").read_text() == "precious\n"


def test_config_summary_and_timeline_replace_a_link_and_leave_its_target(tmp_path, outside):
    from rollart.observability import Timeline, write_summary

    paths = RunPaths.of(tmp_path / "run")
    for path in (paths.config, paths.summary, paths.timeline):
        link(path, outside / "file")
    write_resolved(load_config(None, []), paths.root)
    write_summary(paths.root, {"steps": 1})
    Timeline(start_time=0.0).write(paths)
    assert (outside / "file").read_text() == "precious\n"
    assert not any(p.is_symlink() for p in (paths.config, paths.summary, paths.timeline))
    assert sorted(os.listdir(outside)) == ["file"]


def test_the_report_metrics_and_tensorboard_refuse_a_linked_directory_or_file(tmp_path, outside):
    from rollart.config import ObservabilityConfig
    from rollart.observability import MetricsLogger, build_report

    paths = RunPaths.of(tmp_path / "run")
    link(paths.report_dir, outside)
    with pytest.raises(ValueError, match="report is a symbolic link"):
        build_report(paths.root)
    os.unlink(paths.report_dir)
    link(paths.report, outside / "file")  # the page itself a link: replaced, not followed
    build_report(paths.root)
    link(paths.metrics, outside / "file")
    with pytest.raises(UnsafeRunDir, match="metrics.jsonl is a symbolic link"):
        MetricsLogger(paths.root, ObservabilityConfig(tensorboard=False))
    os.unlink(paths.metrics)
    link(paths.tensorboard, outside)
    with pytest.raises(UnsafeRunDir, match="tensorboard is a symbolic link"):
        MetricsLogger(paths.root, ObservabilityConfig())
    assert (outside / "file").read_text() == "precious\n" and sorted(os.listdir(outside)) == ["file"]


def test_samples_are_never_written_or_read_through_a_link(tmp_path, outside):
    """The issue's hole: a resume of a run directory whose samples.jsonl was a dangling link created the link's
    target outside the run directory (as root), filled with model text; readers followed it too."""
    from rollart.cli import main as cli_main
    from rollart.observability.samples import SampleLog, scan_samples

    paths = RunPaths.of(tmp_path / "run")
    link(paths.samples, outside / "created")  # dangling
    for resume_step in (None, 3):
        with pytest.raises(UnsafeRunDir, match="samples.jsonl is a symbolic link"):
            SampleLog(paths, 1, decode=str, resume_step=resume_step)
    assert sorted(os.listdir(outside)) == ["file"]
    os.unlink(paths.samples)
    link(paths.samples, outside / "file")
    with pytest.raises(UnsafeRunDir, match="samples.jsonl is a symbolic link"):
        scan_samples(paths.samples)
    assert cli_main(["samples", str(paths.root)]) != 0
    assert (outside / "file").read_text() == "precious\n"


@pytest.mark.timeout(60)
def test_a_fifo_or_a_directory_where_a_file_belongs_is_refused_without_blocking(tmp_path, capsys):
    """Opening a FIFO waits for its other end: a run directory holding one hung the report and a resume."""
    from rollart.observability import MetricsLogger, build_report
    from rollart.config import ObservabilityConfig

    paths = RunPaths.of(tmp_path / "run")
    paths.root.mkdir()
    for path in (paths.summary, paths.metrics, paths.samples):
        os.mkfifo(path)
    paths.timeline.mkdir()
    problems = paths.unsafe_paths()
    assert all(any(str(p) in problem and "not a regular file" in problem for problem in problems)
               for p in (paths.summary, paths.metrics, paths.samples, paths.timeline)), problems
    page = build_report(paths.root).read_text()
    assert "summary.json could not be read" in page and "samples.jsonl could not be read" in page
    with pytest.raises(UnsafeRunDir, match="metrics.jsonl cannot be opened safely|not a regular file"):
        MetricsLogger(paths.root, ObservabilityConfig(tensorboard=False))
    with pytest.raises(ConfigError, match="summary.json is not a regular file"):
        check_run_dir(load_config(None, [f"run_dir={paths.root}"]))


def test_rollart_writes_only_the_artefacts_its_contract_names(tmp_path):
    paths = RunPaths.of(tmp_path / "run")
    for stray in (paths.root / "notes.txt", paths.root / "samples.jsonl" / "x", tmp_path / "elsewhere.json"):
        with pytest.raises(ValueError, match="not an artefact of a run directory|not inside the run directory"):
            paths.write(stray, "x")
    assert not paths.root.exists() or not any(paths.root.iterdir())
    assert paths.write(paths.report, "<p>") == paths.report and paths.read_text(paths.report) == "<p>"


def test_a_linked_checkpoints_directory_is_refused_for_writing(tmp_path, outside):
    paths = RunPaths.of(tmp_path / "run")
    link(paths.checkpoints, outside)
    with pytest.raises(UnsafeRunDir, match="checkpoints is a symbolic link"):
        paths.make_dir(paths.checkpoints)


# --- the pre-check, before anything starts -------------------------------------------------------------


def resume(run: Path, *extra: str):
    return load_config(None, [f"run_dir={run}", "resume=true", *extra])


@pytest.mark.parametrize("name", ["ledger.jsonl", "config.yaml", "report/index.html", "metrics.jsonl",
                                  "summary.json", "timeline.json", "tensorboard", "report", "samples.jsonl",
                                  "notes/anything.txt", "checkpoints/step_00000001/model.safetensors"])
def test_the_pre_check_names_every_link_where_rollart_writes(tmp_path, outside, name):
    run = tmp_path / "run"
    link(run / name, outside / "file" if "." in name else outside)
    with pytest.raises(ConfigError, match=f"{run / name} is a symbolic link"):
        check_run_dir(resume(run))
    with pytest.raises(ConfigError, match="symbolic link"):  # a fresh run too
        check_run_dir(load_config(None, [f"run_dir={run}"]))


def test_a_checkpoint_that_links_outside_is_refused_before_anything_starts(tmp_path, outside, cli):
    (outside / "pytorch_model.bin").write_bytes(b"\x80\x04evil")
    (outside / f"{STATE}.json").write_text("{}")
    run = tmp_path / "run"
    link(step_path(run, 7), outside)
    with pytest.raises(ConfigError, match=f"{step_path(run, 7)} is a symbolic link .*outside"):
        check_run_dir(resume(run))
    refused = cli("train", f"run_dir={run}", "resume=true")  # through the CLI: no Ray, no traceback
    assert refused.returncode == 2 and "symbolic link" in refused.stderr and "Traceback" not in refused.stderr
    with pytest.raises(Exception, match="symbolic link"):
        check_checkpoint_files(RunPaths.of(run).checkpoints)


def checkpoint(run: Path, step: int, **extra) -> Path:
    """A minimal checkpoint: trainer state and run state as rollart writes them (no weights needed here)."""
    ckpt = step_path(run, step)
    save_state(ckpt / STATE, {"version": step, "world_size": 1, "optimizer": [{"lr": 1e-3, "params": []}],
                              "scheduler": {}, "sft_optimizer": None})
    save_state(ckpt / "extra_state", {**RunState(step=step).to_checkpoint(), **extra})
    return ckpt


def test_a_sound_checkpoint_passes(tmp_path):
    checkpoint(tmp_path / "run", 4)
    check_run_dir(resume(tmp_path / "run", "train.steps=10"))


def test_corrupt_state_files_are_named_with_their_field(tmp_path):
    run = tmp_path / "run"
    ckpt = checkpoint(run, 4)
    state = json.loads((ckpt / f"{STATE}.json").read_text())
    (ckpt / f"{STATE}.json").write_text(json.dumps({**state, "version": "four"}))
    with pytest.raises(ConfigError, match=rf"{ckpt / STATE}.json: field 'version' must be an integer"):
        check_run_dir(resume(run))
    checkpoint(run, 4)
    text = (ckpt / "extra_state.json").read_text()
    (ckpt / "extra_state.json").write_text(text[: len(text) // 2])  # truncated
    with pytest.raises(ConfigError, match=rf"{ckpt}/extra_state.json: not valid JSON at line 1"):
        check_run_dir(resume(run))
    checkpoint(run, 4, ledger_bytes=-5)
    with pytest.raises(ConfigError, match=r"extra_state.json: field 'ledger_bytes' must be an integer ≥ 0"):
        check_run_dir(resume(run))
    version, internal, gauss = random.Random(0).getstate()
    rng = [version, list(internal), gauss]
    checkpoint(run, 4, scheduler={"next_seq": 3, "rng": rng, "replay": [], "ordinals": {}, "ready": [{"x": 1}]})
    with pytest.raises(ConfigError, match=r"field 'scheduler.ready\[0\]' is not a scored group"):
        check_run_dir(resume(run))


def test_a_resume_step_past_train_steps_is_refused(tmp_path):
    run = tmp_path / "run"
    checkpoint(run, 10**12)
    with pytest.raises(ConfigError, match=r"RL step 1000000000000 .*past train.steps=300"):
        check_run_dir(resume(run))


def test_wandb_keeps_its_own_links_but_wandb_itself_may_not_be_one(tmp_path, outside):
    """W&B writes RUN_DIR/wandb/ with a `latest-run` link of its own: a resume of a W&B run is not refused for it."""
    run = tmp_path / "run"
    (run / "wandb" / "run-1").mkdir(parents=True)
    os.symlink("run-1", run / "wandb" / "latest-run")
    assert RunPaths.of(run).unsafe_paths() == []
    os.rename(run / "wandb", run / "elsewhere")
    link(run / "wandb", outside)
    assert sorted(p.split(" is ")[0] for p in RunPaths.of(run).unsafe_paths()) == [
        str(run / "elsewhere" / "latest-run"), str(run / "wandb")]
