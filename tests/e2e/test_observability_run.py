"""A short (synthetic) run through the observability API: every namespace lands in JSONL and TensorBoard,
the Chrome trace parses and nests, the summary and the report are complete, missing inputs are named."""

from __future__ import annotations

import json

import pytest
from observability_synthetic import check_nesting, write_synthetic_run
from testutil import unknown_run_dir_entries

from rollart.cli import main as cli_main
from rollart.observability import NAMESPACES, build_report, read_metrics


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("run"), steps=4)


def test_every_namespace_reaches_jsonl_and_tensorboard(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = read_metrics(run.metrics)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    names = {k for r in records for k in r if "/" in k}
    assert {n.split("/")[0] for n in names} == set(NAMESPACES)
    expected = {
        "time/generate", "time/env.reset", "time/env.step", "time/reward", "time/train", "time/weights.publish",
        "time/weights.pull", "time/weights.exposed", "time/get_batch_wait", "time/step",
        "env/math/success", "env/frozenlake/reward", "env/math/turns", "env/frozenlake/tokens",
        "env/math/prefill_tokens", "env/math/decode_tokens", "eval/math/score", "eval/mean",
        "buffer/staleness_0", "buffer/aborted", "buffer/stale", "buffer/cancelled", "buffer/wasted_tokens",
        "pools/gen_prefill/utilisation", "pools/env/utilisation", "pools/fallbacks",
        "system/tokens_per_s", "system/rss_mb", "train/loss", "reward/mean", "rollout/trajectories",
        "env/frozenlake/reset_p99_s", "env/math/resets", "env/frozenlake/pool_hits",
    }
    assert expected <= names
    for r in records:
        for k, v in r.items():
            assert v is None or isinstance(v, (int, float)), k
        assert 0 <= r["pools/env/utilisation"] <= 1

    acc = EventAccumulator(str(run.tensorboard), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert names <= tags
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4] and loss[1].value == pytest.approx(0.5)
    assert [e.step for e in acc.Scalars("eval/mean")] == [1, 2, 4]


def test_the_run_directory_holds_only_what_its_contract_names(run):
    build_report(run.root)
    assert {p.name for p in run.root.iterdir()} >= {"metrics.jsonl", "samples.jsonl", "tensorboard", "report"}
    assert not unknown_run_dir_entries(run.root), unknown_run_dir_entries(run.root)


def test_trace_parses_and_spans_nest(run):
    trace = json.loads(run.timeline.read_text())
    threads = check_nesting(trace)
    assert threads > 40  # 40 trajectories plus worker lanes
    assert trace["otherData"]["trajectories"] == 40
    kinds = {ev["name"] for ev in trace["traceEvents"] if ev["ph"] == "X"}
    assert {"trajectory", "env.reset", "generate", "env.step", "reward", "buffer.wait", "train",
            "weights.publish", "get_batch.wait"} <= kinds


def test_summary_holds_the_contract_keys(run):
    summary = json.loads(run.summary.read_text())
    assert summary["steps"] == 4 and summary["completed"] is True
    assert summary["eval_first_by_domain"] == {"frozenlake": 0.1, "math": 0.05}
    assert summary["eval_last"] == pytest.approx(0.3)
    assert summary["wall_s"] > 0
    assert summary["aborted_total"] == 4 and summary["cancelled_total"] == 4  # counters: the last value


def test_report_has_every_section_and_no_missing_inputs(run):
    page = build_report(run.root).read_text()
    for title in ("Summary", "Validation score per domain", "Training reward per domain", "Rollouts",
                  "Step-time breakdown", "Utilisation per pool", "Staleness", "Environment resets per domain",
                  "Trajectory timeline"):
        assert f"<h2>{title}</h2>" in page
    assert 'class="missing"' not in page
    # the rollouts: worst, median and best of each domain at the first, a middle and the last step
    assert [f"<h3>step {s}</h3>" in page for s in (1, 3, 4)] == [True] * 3 and "<h3>step 2</h3>" not in page
    assert page.count("<details><summary>step 4 · math · ") == 3 and "tok0 tok1 tok2 tok3 tok4" in page
    assert "<h3>Trajectories not trained (run totals)</h3><table><tr><th>aborted</th><td>4</td>" in page
    assert "<th>fallbacks taken (run total)</th><td>1</td>" in page and "<th>gen_decode</th><td>1 in, 0 out" in page
    assert "<th>gen_prefill</th><td>0 in, 1 out" in page
    assert "<th>frozenlake</th><td>16 resets," in page and "from the warm pool" in page
    assert "<th>math</th><td>16 resets," in page and "no warm pool" in page
    # 9 plots, and the mismatch section's three (KL, importance-weight quantiles, tokens truncated or masked)
    assert page.count('src="data:image/png;base64,') == 12
    assert "http://" not in page and "https://" not in page  # self-contained


def test_report_says_what_is_missing(tmp_path):
    page = build_report(tmp_path).read_text()
    assert "metrics.jsonl is missing" in page and "timeline.json is missing" in page
    assert "summary.json is missing" in page and "config.yaml is missing" in page
    assert "<img" not in page
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "wall_s": 1.0, "train/loss": 1.0}\n')
    page = build_report(tmp_path).read_text()
    assert "no data: no eval/&lt;domain&gt;/score metrics were logged" in page
    assert "metrics.jsonl is missing" not in page


def test_cli_report(run, tmp_path, capsys):
    assert cli_main(["report", str(run.root), "--gantt-rows", "5"]) == 0
    assert "report/index.html" in capsys.readouterr().out
    assert cli_main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
