"""Rollouts you can read: samples.jsonl holds, per domain and step, the worst, a median and the best trajectory
with each turn's text decoded by the run's tokenizer (chat template included); `rollart samples` prints them;
TensorBoard's text tab gets them; what a policy writes stays data (capped, escaped)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollart.cli import main
from rollart.models.loading import load_tokenizer
from rollart.observability import MetricsLogger
from rollart.base.untrusted import printable
from rollart.observability.samples import SampleLog, cap, ranks, read_samples, render_markdown, scan_samples
from rollart.config import ObservabilityConfig
from rollart.base.run_dir import RunPaths
from rollart.types import Status, Task, Trajectory, Turn


def test_ranks_spread_over_the_batch() -> None:
    assert ranks(10, 3) == [(0, "worst"), (4, "median"), (9, "best")]
    assert ranks(10, 1) == [(4, "median")] and ranks(10, 2) == [(0, "worst"), (9, "best")]
    assert ranks(9, 5) == [(0, "worst"), (2, "p25"), (4, "median"), (6, "p75"), (8, "best")]
    assert ranks(4, 3) == [(0, "worst"), (1, "median"), (3, "best")]
    assert ranks(2, 3) == [(0, "worst"), (1, "best")] and ranks(1, 3) == [(0, "only")] and ranks(5, 0) == []


def trajectory(tokenizer, tid: str, domain: str, reward: float, answer: str) -> Trajectory:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"What is 1 + {tid[-1]}?"}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    response = tokenizer.encode(answer, add_special_tokens=False)
    turn = Turn(tuple(prompt), tuple(response), (-0.5,) * len(response), (3,) * len(response),
                observation="obs", action=answer)
    return Trajectory(tid, Task(tid, domain, domain, seed=7, group_id="g1"), start_version=3,
                      turns=(turn,), reference={"answer": "2"}).finished(Status.COMPLETED).scored(reward)


def test_samples_hold_the_text_the_model_saw_and_wrote(tmp_path: Path, tiny_model_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_path)
    decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)  # noqa: E731
    batch = [trajectory(tokenizer, f"t{i}", "math", reward=i / 4, answer=f"\\boxed{{{i}}}") for i in range(5)]
    batch.append(trajectory(tokenizer, "u0", "lake", reward=1.0, answer="\\boxed{Right}"))
    shown: list[tuple[int, str, str]] = []
    log = SampleLog(RunPaths.of(tmp_path), per_domain=3, decode=decode,
                    text=lambda step, tag, md: shown.append((step, tag, md)))
    log.write(4, 4, batch)
    log.close()
    samples = read_samples(tmp_path / "samples.jsonl", [4])
    assert [(s["domain"], s["rank"], s["reward"]) for s in samples] == [
        ("lake", "only", 1.0), ("math", "worst", 0.0), ("math", "median", 0.5), ("math", "best", 1.0)]
    best = samples[-1]
    assert best["turns"][0]["response"] == "\\boxed{4}"  # what the model wrote, token for token
    assert "What is 1 + 4?" in best["turns"][0]["prompt"] and "<|im_start|>" in best["turns"][0]["prompt"]
    assert best["turns"][0]["prompt_tokens"] == len(batch[4].turns[0].prompt_token_ids)
    assert (best["status"], best["versions"], best["version"], best["seed"]) == ("completed", [3, 3], 4, 7)
    assert best["reference"] == {"answer": "2"}
    assert [tag for _, tag, _ in shown] == ["samples/lake", "samples/math"]
    assert "    " + best["turns"][0]["response"] in shown[1][2]  # a code block: the policy's text is not markup


def test_what_a_policy_writes_is_capped_and_escaped(tmp_path: Path) -> None:
    assert cap("x" * 10, 4) == "xxxx\n[… 6 more characters cut (observability.sample_max_chars)]"
    assert printable("red \x1b[31mtext\x07\nnext\tline") == "red \\x1b[31mtext\\x07\nnext\tline"
    hostile = "\x1b]0;pwned\x07</pre><script>alert(1)</script>" + "y" * 5000
    traj = Trajectory("t0", Task("t0", "d", "d", seed=0, group_id="g"), 0,
                      turns=(Turn((1,), (2,), (-1.0,), (0,)),)).finished(Status.COMPLETED).scored(0.0)
    log = SampleLog(RunPaths.of(tmp_path), per_domain=1, decode=lambda ids: hostile, max_chars=100)
    sample = log.write(0, 0, [traj])[0]
    log.close()
    assert len(sample["turns"][0]["response"]) < 200
    assert "\x1b" not in printable(sample["turns"][0]["response"])
    hostile_lines = [line for line in render_markdown(sample).splitlines() if "<script>" in line]
    assert hostile_lines and all(line.startswith("    ") for line in hostile_lines)  # code, never markup


def test_a_resumed_run_drops_the_samples_of_steps_it_runs_again(tmp_path: Path) -> None:
    traj = Trajectory("t0", Task("t0", "d", "d", seed=0, group_id="g"), 0,
                      turns=(Turn((1,), (2,), (-1.0,), (0,)),)).finished(Status.COMPLETED).scored(0.0)
    log = SampleLog(RunPaths.of(tmp_path), 1, decode=str)
    for step in range(4):
        log.write(step, step, [traj])
    log.close()
    SampleLog(RunPaths.of(tmp_path), 1, decode=str, resume_step=2).close()
    assert scan_samples(tmp_path / "samples.jsonl").steps() == [0, 1]


def test_samples_reach_tensorboards_text_tab(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, ObservabilityConfig()) as logger:
        logger.text(3, "samples/math", "**best** — a rollout")
    acc = EventAccumulator(str(RunPaths.of(tmp_path).tensorboard), size_guidance={"tensors": 0})
    acc.Reload()
    assert "samples/math/text_summary" in acc.Tags()["tensors"]
    assert [e.step for e in acc.Tensors("samples/math/text_summary")] == [3]


def test_rollart_samples_prints_them(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    lines = []
    for step in (0, 1):
        for rank, reward in (("worst", 0.0), ("median", 0.5), ("best", 1.0)):
            turn = {"prompt": f"prompt of step {step}", "response": f"{rank} answer \x1b[2J", "prompt_tokens": 4,
                    "response_tokens": 2, "env_reward": 0.0, "finish_reason": "stop", "format_ok": True,
                    "versions": [step, step]}
            lines.append({"step": step, "version": step, "domain": "math", "rank": rank, "trajectory_id": f"t{rank}",
                          "group_id": "g", "seed": 1, "status": "completed", "status_reason": "", "reward": reward,
                          "reward_details": {}, "env_return": 0.0, "reference": {"answer": "4"},
                          "start_version": step, "versions": [step, step], "prompt_tokens": 4,
                          "response_tokens": 2, "turns": [turn]})
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["samples", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("=== step 1 · math") == 3 and "prompt of step 1" in out and "step 0" not in out
    assert "best answer \\x1b[2J" in out and "\x1b" not in out  # a terminal escape is shown, not obeyed
    assert main(["samples", str(tmp_path), "--step", "0", "--worst"]) == 0
    out = capsys.readouterr().out
    assert out.count("===") == 1 and "step 0 · math · worst · reward 0.000 (completed)" in out
    assert main(["samples", str(tmp_path), "--domain", "lake"]) == 2
    assert "--domain lake: " in capsys.readouterr().err
    assert main(["samples", str(tmp_path / "nowhere")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "samples.jsonl").write_text("")  # a run before its first step: nothing to show, said so
    capsys.readouterr()
    assert main(["samples", str(empty)]) == 2
    assert "holds no samples yet" in capsys.readouterr().err


def sample_line(step: int = 0, **fields) -> dict:
    turn = {"prompt": "p", "response": "r", "prompt_tokens": 1, "response_tokens": 1, "env_reward": 0.0,
            "finish_reason": "stop", "format_ok": True, "versions": [0, 0]}
    record = {"step": step, "version": 0, "domain": "d", "rank": "median", "trajectory_id": "t", "group_id": "g",
              "seed": 0, "status": "completed", "status_reason": "", "reward": 1.0, "reward_details": {},
              "env_return": 0.0, "reference": None, "start_version": 0, "versions": [0, 0], "prompt_tokens": 1,
              "response_tokens": 1, "turns": [turn]}
    return {**record, **fields}


def test_a_crafted_samples_file_is_data_in_the_report_and_the_terminal(tmp_path: Path, capsys) -> None:
    """The issue's stored XSS: step numbers and token counts were written into the page unescaped; a field of
    another type than written failed the whole report (a string reward: `Unknown format code 'f'`)."""
    from rollart.observability import build_report

    x = "<script>alert(1)</script>"
    crafted = [sample_line(x), sample_line(1, reward="high"), sample_line(1, turns=[{"prompt_tokens": x}]),
               sample_line(1, status_reason=x, domain=x, trajectory_id=x, rank="best"), sample_line(2)]
    raw = b"".join(json.dumps(r).encode() + b"\n" for r in crafted)
    (tmp_path / "samples.jsonl").write_bytes(raw + b'{"step": 3, "domain": "caf\xe9"}\n' + b"{torn")
    page = build_report(tmp_path).read_text()
    assert x not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown, as text
    assert "lines skipped" in page and "invalid UTF-8" in page and "field &#x27;step&#x27;" in page
    assert main(["samples", str(tmp_path), "--step", "1"]) == 0
    captured = capsys.readouterr()
    assert "step 1 · <script>" in captured.out and "samples.jsonl: lines skipped: " in captured.err
    for reason in ("not a sample (field 'step' is missing or not a int) (line 1)",
                   "not a sample (field 'reward' is missing or not a int/float/NoneType) (line 2)",
                   "not a sample (turn 0: field 'prompt' is missing or not a str) (line 3)",
                   "with invalid UTF-8 (invalid continuation byte) (line 6)", "not JSON (torn by a crash?) (line 7)"):
        assert reason in captured.err


def test_the_tensorboard_headline_is_literal_markdown() -> None:
    x = "<img src=x onerror=alert(1)> [link](javascript:alert(1)) **bold**"
    markdown = render_markdown(sample_line(0, status_reason=x, rank="<b>best</b>"))
    first = markdown.splitlines()[0]
    assert "<img" not in first and "<b>" not in first and "](" not in first and "**bold**" not in first
    assert "&lt;img src=x onerror=alert\\(1\\)&gt;" in first


@pytest.mark.timeout(300)
def test_a_sparse_samples_file_is_streamed_not_read_whole(tmp_path: Path) -> None:
    """`rollart samples` and `rollart report` read samples.jsonl whole: a 4 GiB sparse file (one line of NUL
    bytes) ran them out of memory. A 1 GiB one under a 1.5 GiB address-space limit (reading it whole takes
    2 GiB: the bytes and their text) — both now finish, skipping the line."""
    import resource
    import subprocess
    import sys

    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(sample_line(5)) + "\n")
    with path.open("r+b") as f:
        f.truncate(2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))

    for command in (["samples", str(tmp_path)], ["report", str(tmp_path)]):
        done = subprocess.run([sys.executable, "-m", "rollart.cli", *command], capture_output=True, text=True,
                              preexec_fn=limit, timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
    assert "step 5 · d · median" in (tmp_path / "report" / "index.html").read_text()
