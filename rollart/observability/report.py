"""`rollart report RUN_DIR`: one self-contained HTML page about a run.

In: RUN_DIR/{config.yaml, metrics.jsonl, samples.jsonl, timeline.json, summary.json} — any of them may be
missing. Out: RUN_DIR/report/index.html with PNG plots embedded as base64 data URIs: summary table,
validation score (and pass@k / avg@n when sampled) and training reward per domain over steps and wall time,
rollouts as text (the worst, a median and the best trajectory of each domain at the first, a middle and the
last step with samples), step-time breakdown as stacked bars, utilisation and fallbacks per pool, staleness
histogram and rollout losses, the train–inference mismatch (KL, importance-weight quantiles, tokens truncated
or masked), env resets per domain (totals, retries, warm-pool hits, latency percentiles), and the Gantt
charts of trajectories and workers.

Guarantees: the page loads nothing from anywhere (a Content-Security-Policy forbids every fetch but
data: images), so it opens offline, from a mail attachment or a CI artefact; an input that is missing or
unreadable turns its section into a sentence saying what is missing, never a failed report; everything a run
directory holds — model text, step numbers, token counts, names, reasons — is escaped text, never markup
(each value goes through `html.escape` where it is placed, and samples are type-checked as they are read);
samples.jsonl is streamed, and only the samples of the steps shown are held.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from rollart.observability import plots
from rollart.observability.records import COUNTERS, Record, domains_with, read_metrics, series
from rollart.observability.samples import SampleIndex, headline, read_samples, scan_samples
from rollart.base.run_dir import RunPaths
from rollart.observability.timeline import Trace, load_trace
from rollart.observability.utilisation import pool_utilisation

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_CSS = """
body { font-family: system-ui, -apple-system, 'DejaVu Sans', sans-serif; margin: 2em auto; max-width: 1150px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
img { max-width: 100%; display: block; margin: .5em 0; }
table { border-collapse: collapse; font-size: .9em; }
td, th { border: 1px solid #ddd; padding: .25em .6em; text-align: left; }
.missing { color: #a15c00; background: #fff6e5; padding: .5em .8em; border-left: 3px solid #f0a030; }
.note { color: #666; font-size: .85em; }
details { margin: .3em 0; } summary { cursor: pointer; font-size: .9em; }
pre { background: #f6f6f6; padding: .5em; white-space: pre-wrap; word-break: break-all; font-size: .8em;
      max-height: 30em; overflow: auto; }
"""


@dataclass
class _Inputs:
    paths: RunPaths
    records: list[Record] | None
    samples: tuple[SampleIndex, list[int], list[dict[str, Any]]] | None  # index, steps shown, their samples
    trace: Trace | None
    summary: dict[str, Any] | None
    config: dict[str, Any] | None
    problems: dict[str, str]  # input name → why it is unavailable


def _load(paths: RunPaths) -> _Inputs:
    problems: dict[str, str] = {}

    def attempt(name: str, path: Path, read: Callable[[Path], Any]) -> Any:
        if not os.path.lexists(path):
            problems[name] = f"{path.name} is missing from {paths.root}"
            return None
        try:
            return read(path)
        except (OSError, ValueError, yaml.YAMLError, RecursionError) as exc:
            problems[name] = f"{path.name} could not be read: {str(exc)[:300]}"
            return None

    def mapping(text: str, load: Callable[[str], Any], what: str) -> dict[str, Any]:
        value = load(text)
        if not isinstance(value, dict):
            raise ValueError(f"{what} is a {type(value).__name__}, not a mapping")
        return value

    records = attempt("metrics", paths.metrics, read_metrics)
    if records == []:
        problems["metrics"] = f"{paths.metrics.name} holds no records yet"
        records = None
    return _Inputs(
        paths=paths,
        records=records,
        samples=attempt("samples", paths.samples, _shown_samples),
        trace=attempt("timeline", paths.timeline, load_trace),
        summary=attempt("summary", paths.summary,
                        lambda p: mapping(paths.read_text(p, _SMALL), json.loads, "summary.json")),
        config=attempt("config", paths.config,
                       lambda p: mapping(paths.read_text(p, _SMALL), yaml.safe_load, "config.yaml")),
        problems=problems,
    )


_SMALL = 16 * 2**20  # summary.json and config.yaml: rollart writes a few kilobytes


def _shown_samples(path: Path) -> tuple[SampleIndex, list[int], list[dict[str, Any]]]:
    """Which steps samples.jsonl holds, the first, a middle and the last of them, and their samples: two
    streamed passes, holding only the samples shown."""
    index = scan_samples(path)
    steps = index.steps()
    shown = sorted({steps[0], steps[len(steps) // 2], steps[-1]}) if steps else []
    return index, steps, read_samples(path, shown)


def _get(data: Any, *keys: str) -> Any:
    """data[k1][k2]… where each level is a mapping; None where one is missing or not a mapping."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _missing(text: str) -> str:
    return f'<p class="missing">{html.escape(text)}</p>'


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(rows: list[tuple[str, Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, dict):
            return ", ".join(f"{k}: {fmt(x)}" for k, x in v.items()) or "—"
        return "—" if v is None else str(v)

    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(fmt(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _plot_or_missing(png: bytes | None, alt: str, need: str, inputs: _Inputs, source: str = "metrics") -> str:
    if source in inputs.problems:
        return _missing(inputs.problems[source])
    return _img(png, alt) if png else _missing(f"no data: {need}")


# --- sections ----------------------------------------------------------------------------------------


def _summary(inp: _Inputs) -> str:
    parts = []
    if inp.summary is not None:
        parts.append(_table(sorted(inp.summary.items())))
    else:
        parts.append(_missing(inp.problems.get("summary", "summary.json is missing")))
    if inp.config is not None:
        cfg = inp.config
        domains = _get(cfg, "domains")
        parts.append("<h3>Configuration</h3>" + _table([
            ("domains", {str(d): f"{_get(v, 'env')} on {_get(v, 'pool')}"
                         for d, v in (domains.items() if isinstance(domains, dict) else ())}),
            ("staleness bound α", _get(cfg, "rollout", "alpha")),
            ("staleness mode", _get(cfg, "rollout", "staleness")),
            ("barrier", _get(cfg, "rollout", "barrier")),
            ("batch size / group size", f"{_get(cfg, 'rollout', 'batch_size')} / {_get(cfg, 'rollout', 'group_size')}"),
            ("train steps", _get(cfg, "train", "steps")),
            ("model", _get(cfg, "model", "path") or "built-in tiny model"),
        ]))
    else:
        parts.append(_missing(inp.problems.get("config", "config.yaml is missing")))
    return "".join(parts)


def _eval(inp: _Inputs) -> str:
    records = inp.records or []
    png = plots.domain_metric_png(records, "eval/", "/score", "validation score", mean="eval/mean")
    out = _plot_or_missing(png, "validation score per domain", "no eval/<domain>/score metrics were logged", inp)
    sampled = sorted({k for rec in records for k in rec if k.startswith("eval/") and ("/pass@" in k or "/avg@" in k)},
                     key=lambda k: (k.split("/")[1], "/avg@" in k, int(k.rsplit("@", 1)[1])))
    passes = plots.curves_png(records, [(k.removeprefix("eval/"), k) for k in sampled], "pass@k / avg@n")
    if passes and "metrics" not in inp.problems:  # eval.samples > 0: beside the greedy score
        out += _img(passes, "pass@k and avg@n per domain")
    return out


def _reward(inp: _Inputs) -> str:
    records = inp.records or []
    reward = plots.domain_metric_png(records, "env/", "/reward", "training reward", smooth=True)
    success = plots.domain_metric_png(records, "env/", "/success", "success rate", smooth=True)
    out = _plot_or_missing(reward, "training reward per domain", "no env/<domain>/reward metrics were logged", inp)
    if success and "metrics" not in inp.problems:
        out += _img(success, "success rate per domain")
    return out


SHOWN_RANKS = ("worst", "median", "best", "only")


def _samples(inp: _Inputs) -> str:
    """The worst, a median and the best trajectory of each domain, at the first, a middle and the last step."""
    if inp.samples is None:
        return _missing(inp.problems["samples"] + " (the run wrote none: observability.samples_per_domain=0, or it "
                        "predates samples)")
    index, steps, shown = inp.samples
    skipped = index.skipped.describe(inp.paths.samples)
    if not steps:
        return _missing("samples.jsonl holds no samples yet" + (f" ({skipped})" if skipped else ""))
    e = _escape
    out = [f'<p class="note">{len(steps)} steps have samples (`rollart samples {e(inp.paths.root)} '
           "--step N` prints any of them); shown: the first, a middle and the last. Each prompt is the text the "
           "turn added to the model's context, chat template included; each response what the model wrote.</p>"]
    if skipped:
        out.append(_missing(skipped))
    for step in sorted({s["step"] for s in shown}):
        out.append(f"<h3>step {e(step)}</h3>")
        for sample in (s for s in shown if s["step"] == step and s["rank"] in SHOWN_RANKS):
            turns = "".join(
                f'<p class="note">turn {i}: prompt ({e(t["prompt_tokens"])} tokens)</p>'
                f'<pre>{e(t["prompt"])}</pre>'
                f'<p class="note">turn {i}: response ({e(t["response_tokens"])} tokens, {e(t["finish_reason"])}'
                f'{"" if t["format_ok"] else ", malformed"})</p><pre>{e(t["response"])}</pre>'
                for i, t in enumerate(sample["turns"], start=1))
            out.append(f"<details><summary>{e(headline(sample))}</summary>{turns}</details>")
    return "".join(out)


def _escape(value: Any) -> str:
    """Any value as HTML text (quotes too: safe in an attribute as in an element)."""
    return html.escape(str(value), quote=True)


def _breakdown(inp: _Inputs) -> str:
    png = plots.step_breakdown_png(inp.records or [])
    note = ('<p class="note">Middle: each step\'s wall time (time/step) as two bars that add up to it: waiting '
            'for the batch (time/get_batch_wait) and the rest of the step (a train step landed in line, an '
            'evaluation, a checkpoint). The lines are the train step (time/train; with a critic, the part it '
            'takes: time/critic) and the weight sync (time/weights.exposed), which overlap the wait unless the run is synchronous. Right: '
            'time/&lt;phase&gt; ÷ rollout/trajectories — rollout overlaps training, so its phases are '
            'trajectory-seconds.</p>')
    return _plot_or_missing(png, "step-time breakdown", "no time/* metrics were logged", inp) + note


def _utilisation(inp: _Inputs) -> str:
    overall = pool_utilisation(inp.trace.worker_spans()) if inp.trace else {}
    png = plots.utilisation_png(inp.records or [], overall)
    out = _img(png, "utilisation per pool") if png else _missing(
        "no pools/<pool>/utilisation metrics and no worker spans in the timeline"
    )
    for name in ("metrics", "timeline"):
        if name in inp.problems:
            out += _missing(inp.problems[name])
    return out + _fallbacks(inp.records or [])


def _fallbacks(records: list[Record]) -> str:
    """Pool fallbacks are never silent (an invariant: docs/architecture.md §5): the resource plane's counters, shown."""
    _, total = series(records, "pools/fallbacks")
    if not total:
        return _missing("no pools/fallbacks counter was logged: fallbacks from preferred pools are unknown")
    rows: list[tuple[str, Any]] = [("fallbacks taken (run total)", total[-1])]
    def last(name: str) -> float:
        values = series(records, name)[1]
        return values[-1] if values else 0.0

    pools = {*domains_with(records, "pools/", "/fallbacks_in"), *domains_with(records, "pools/", "/fallbacks_out")}
    for pool in sorted(pools):
        taken_in, taken_out = last(f"pools/{pool}/fallbacks_in"), last(f"pools/{pool}/fallbacks_out")
        if taken_in or taken_out:
            rows.append((pool, f"{taken_in:g} in, {taken_out:g} out"))
    return "<h3>Pool fallbacks</h3>" + _table(rows)


def _staleness(inp: _Inputs) -> str:
    records = inp.records or []
    png = plots.staleness_png(plots.staleness_histogram(records))
    out = _plot_or_missing(png, "staleness histogram", "no buffer/staleness_<k> metrics were logged", inp)
    if records:
        totals = [(k, series(records, f"buffer/{k}")[1][-1]) for k in COUNTERS if series(records, f"buffer/{k}")[1]]
        out += "<h3>Trajectories not trained (run totals)</h3>" + (
            _table(totals) if totals else _missing("no buffer/{aborted, stale, failed, wasted_tokens} counters"))
    return out


def _mismatch(inp: _Inputs) -> str:
    """The behaviour correction's measurements per step: the KL between the engine's and the trainer's
    log-probabilities, the importance-weight quantiles and the share of tokens it truncated or masked."""
    records = inp.records or []
    kl = plots.curves_png(records, [("engine vs trainer (same version)", "train/mismatch_kl"),
                                    ("behaviour vs proximal (all tokens)", "train/behaviour_kl")], "KL")
    out = _plot_or_missing(kl, "train-inference mismatch KL", "no train/mismatch_kl metrics were logged", inp)
    quantiles = plots.curves_png(records, [(q, f"train/iw_{q}") for q in ("p01", "p50", "p99")],
                                 "π_prox / μ quantile")
    if quantiles and "metrics" not in inp.problems:
        out += _img(quantiles, "importance-weight quantiles")
    cut = plots.curves_png(records, [("truncated", "train/iw_truncated_frac"), ("masked", "train/iw_masked_frac")],
                           "fraction of tokens")
    if cut and "metrics" not in inp.problems:
        out += _img(cut, "fraction of tokens truncated or masked")
    return out


def _resets(inp: _Inputs) -> str:
    """Env resets per domain: the env workers' totals (last value) and the per-step latency percentiles."""
    records = inp.records or []
    if "metrics" in inp.problems:
        return _missing(inp.problems["metrics"])
    domains = domains_with(records, "env/", "/resets")
    if not domains:
        return _missing("no env/<domain>/resets metrics were logged")

    def last(name: str) -> float:
        values = series(records, name)[1]
        return values[-1] if values else 0.0

    rows: list[tuple[str, Any]] = []
    for d in domains:
        p50, p99 = series(records, f"env/{d}/reset_p50_s")[1], series(records, f"env/{d}/reset_p99_s")[1]
        hits, misses = last(f"env/{d}/pool_hits"), last(f"env/{d}/pool_misses")
        staged = last(f"env/{d}/pool_staged_hits")
        pool = (f"{hits:g} of {hits + misses:g} from the warm pool ({staged:g} staged for their group)"
                if hits + misses else "no warm pool")
        latency = (f"p50 {statistics.median(p50) * 1e3:.1f} ms (median over steps), p99 up to {max(p99) * 1e3:.1f} ms"
                   if p50 and p99 else "no latency logged")
        rows.append((d, f"{last(f'env/{d}/resets'):g} resets, {last(f'env/{d}/reset_retries'):g} retries, "
                        f"{last(f'env/{d}/resets_failed'):g} out of tries; {pool}; {latency}"))
    png = plots.domain_metric_png(records, "env/", "/reset_p99_s", "reset p99 per step (s)")
    return _table(rows) + (_img(png, "reset p99 per domain") if png else "")


def _timeline(inp: _Inputs, gantt_rows: int) -> str:
    if inp.trace is None:
        return _missing(inp.problems.get("timeline", "timeline.json is missing"))
    out = []
    for png, alt in ((plots.trajectory_gantt_png(inp.trace, gantt_rows), "trajectory Gantt chart"),
                     (plots.worker_gantt_png(inp.trace), "worker Gantt chart")):
        out.append(_img(png, alt) if png else _missing(f"the timeline holds no spans for the {alt}"))
    if inp.trace.marks:
        out.append("<h3>Faults and recoveries (dashed lines on the charts)</h3>" + _table(
            [(f"{m.time:.1f} s  {m.name}", f"{m.worker} {m.detail}".strip()) for m in inp.trace.marks]))
    dropped = inp.trace.meta.get("dropped_trajectories", 0)
    capped = f" {dropped:g} trajectories beyond observability.timeline_max_trajectories are not in it." if dropped else ""
    out.append(f'<p class="note">Open {_escape(inp.paths.timeline)} in Perfetto (ui.perfetto.dev) '
               f"or chrome://tracing for every span.{_escape(capped)}</p>")
    return "".join(out)


def build_report(run_dir: str | Path, *, gantt_rows: int | None = None) -> Path:
    """Write RUN_DIR/report/index.html and return its path. ValueError if RUN_DIR is not a directory."""
    paths = RunPaths.of(run_dir)
    if not paths.root.is_dir():
        raise ValueError(f"run directory {paths.root} does not exist (give the run_dir of a run)")
    inp = _load(paths)
    if gantt_rows is None:  # the run's own setting, when config.yaml holds a sane one
        configured = _get(inp.config, "observability", "gantt_rows")
        gantt_rows = configured if isinstance(configured, int) and 1 <= configured <= 10_000 else 48
    sections = [
        ("Summary", _summary(inp)),
        ("Validation score per domain", _eval(inp)),
        ("Training reward per domain", _reward(inp)),
        ("Rollouts", _samples(inp)),
        ("Step-time breakdown", _breakdown(inp)),
        ("Utilisation per pool", _utilisation(inp)),
        ("Staleness", _staleness(inp)),
        ("Train–inference mismatch", _mismatch(inp)),
        ("Environment resets per domain", _resets(inp)),
        ("Trajectory timeline", _timeline(inp, gantt_rows)),
    ]
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    body = "".join(f"<h2>{html.escape(t)}</h2>{s}" for t, s in sections)
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>rollart report: {html.escape(paths.root.name)}</title><style>{_CSS}</style></head><body>"
        f"<h1>rollart report: {html.escape(str(paths.root))}</h1>"
        f'<p class="note">generated {now}</p>{body}</body></html>'
    )
    return paths.write(paths.report, page)  # report/ and index.html: never through a link
