"""The report shows what the algorithms measure: the train–inference mismatch (KL, importance-weight
quantiles, tokens truncated or masked) and pass@k / avg@n beside the greedy validation score — and says
plainly when a run logged none of it."""

import json

from rollart.observability import build_report


def write(run, records):
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return build_report(run).read_text()


def test_mismatch_and_pass_at_k_are_drawn(tmp_path):
    records = [{"step": s, "wall_s": 10.0 * s, "train/mismatch_kl": 1e-4 * s, "train/behaviour_kl": 2e-4 * s,
                "train/iw_p01": 0.9, "train/iw_p50": 1.0, "train/iw_p99": 1.1, "train/iw_truncated_frac": 0.01,
                "train/iw_masked_frac": 0.0, "eval/math/score": 0.1 * s, "eval/math/pass@1": 0.1 * s,
                "eval/math/pass@4": 0.2 * s, "eval/math/avg@4": 0.1 * s} for s in range(4)]
    page = write(tmp_path / "run", records)
    for alt in ("train-inference mismatch KL", "importance-weight quantiles", "fraction of tokens truncated or masked",
                "pass@k and avg@n per domain", "validation score per domain"):
        assert f'<img alt="{alt}"' in page, alt


def test_a_run_without_them_says_so(tmp_path):
    page = write(tmp_path / "run", [{"step": 0, "wall_s": 0.0, "eval/math/score": 0.5}])
    assert "no train/mismatch_kl metrics were logged" in page and "pass@k and avg@n" not in page
