"""Lanes, utilisation and the Chrome trace: spans nest within every thread, and the trace reads back."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from observability_synthetic import check_nesting, partial_overlaps

from rollart.base.run_dir import RunPaths
from rollart.observability import Timeline, assign_lanes, load_trace, pool_utilisation, worker_utilisation
from rollart.observability.utilisation import union_seconds, worker_pool
from rollart.types import Span, Status, Task, Trajectory, Turn


intervals = st.lists(
    st.tuples(st.integers(0, 50), st.integers(0, 20)).map(lambda p: (float(p[0]), float(p[0] + p[1]))),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(intervals)
def test_lanes_never_hold_partial_overlaps(ivs):
    lanes = assign_lanes(ivs)
    assert len(lanes) == len(ivs)
    by_lane = defaultdict(list)
    for iv, lane in zip(ivs, lanes):
        by_lane[lane].append(iv)
    for lane_ivs in by_lane.values():
        assert partial_overlaps(lane_ivs) == []


def test_lanes_keep_nested_and_sequential_spans_together():
    assert assign_lanes([(0, 10), (1, 2), (2, 5), (3, 4), (10, 12)]) == [0, 0, 0, 0, 0]
    assert assign_lanes([(0, 2), (1, 3), (2.5, 4)]) == [0, 1, 0]


@settings(max_examples=100, deadline=None)
@given(intervals, st.tuples(st.integers(0, 40), st.integers(1, 40)))
def test_union_is_bounded_by_window_and_sum(ivs, w):
    window = (float(w[0]), float(w[0] + w[1]))
    u = union_seconds(ivs, window)
    assert 0 <= u <= window[1] - window[0] + 1e-9
    assert u <= sum(e - s for s, e in ivs) + 1e-9


def test_utilisation_counts_concurrency_once_and_idle_workers():
    spans = [
        Span("generate", 0, 4, "inference/gen_decode/0"),
        Span("generate", 2, 6, "inference/gen_decode/0"),  # concurrent request on the same worker
        Span("env.step", 0, 2, "env/env/0"),
        Span("get_batch.wait", 0, 10, "control/driver/0"),  # waiting is not work
        Span("buffer.wait", 0, 10),
    ]
    w = worker_utilisation(spans, (0, 10), workers=["env/env/1"])
    assert w == {"env/env/0": 0.2, "env/env/1": 0.0, "inference/gen_decode/0": 0.6}
    assert pool_utilisation(spans, (0, 10), workers=["env/env/1"]) == {"env": 0.1, "gen_decode": 0.6}
    assert pool_utilisation(spans) == {"env": 2 / 6, "gen_decode": 1.0}  # default window: busy spans' extent
    assert worker_pool("reward/reward/serverless") == "reward" and worker_pool("env/0") == "env"


def _trajectory(tid, start, gen_worker="inference/gen_prefill/0", skew=0.0):
    g1 = Span("generate", start + 0.1, start + 1.0, gen_worker)
    s1 = Span("env.step", start + 1.0 - skew, start + 1.2, "env/env/0")  # skew: starts before generate ended
    g2 = Span("generate", start + 1.2, start + 2.0, gen_worker)
    turns = (Turn((1,), (2,), (-0.1,), (0,), spans=(g1, s1)), Turn((3,), (4,), (-0.1,), (0,), spans=(g2,)))
    t = Trajectory(tid, Task(tid, "lake", "lake", 0, "g"), 0, turns,
                   spans=(Span("env.reset", start, start + 0.1, "env/env/0"),)).finished(Status.COMPLETED)
    return t.scored(1.0, spans=(Span("reward", start + 2.0, start + 2.1, "reward/reward/serverless"),
                                Span("buffer.wait", start + 2.1, start + 3.0)))


def test_chrome_trace_layout_nesting_and_round_trip(tmp_path):
    tl = Timeline(start_time=1000.0)
    tl.add_trajectory(_trajectory("t0", 1000.0))
    tl.add_trajectory(_trajectory("t1", 1000.5, skew=0.05))  # overlaps t0 on the same workers
    tl.add_span(Span("train", 1003.0, 1004.0, "trainer/train/0"), step=1)
    path = tl.write(RunPaths.of(tmp_path))
    trace = json.loads(path.read_text())
    check_nesting(trace)

    names = {(ev["pid"], ev.get("tid")): ev["args"]["name"] for ev in trace["traceEvents"]
             if ev["ph"] == "M" and ev["name"] in ("process_name", "thread_name")}
    processes = {v for (pid, tid), v in names.items() if tid is None}
    assert processes == {"trajectories", "pool gen_prefill", "pool env", "pool reward", "pool train"}
    threads = {v for (pid, tid), v in names.items() if tid is not None}
    # t1's env.step partially overlaps its generate (clock skew): it moves to a second lane
    assert {"t0 [lake]", "t1 [lake]", "t1 [lake] #2"} <= threads
    # two trajectories generate at once on one worker: two lanes of that worker
    assert {"inference/gen_prefill/0", "inference/gen_prefill/0 #2"} <= threads

    outer = [ev for ev in trace["traceEvents"] if ev.get("name") == "trajectory"]
    assert [(ev["ts"], ev["dur"], ev["args"]["status"]) for ev in outer] == [
        (0, 3_000_000, "completed"), (500_000, 3_000_000, "completed")]
    assert trace["otherData"]["t0_unix"] == 1000.0 and trace["otherData"]["trajectories"] == 2

    loaded = load_trace(path)
    worker_spans = loaded.worker_spans()
    assert sum(1 for s in worker_spans if s.name == "generate") == 4
    assert {s.worker for s in worker_spans} >= {"env/env/0", "trainer/train/0", "reward/reward/serverless"}
    traj_view = [s for s in loaded.spans if s.view == "trajectory" and s.trajectory_id == "t0"]
    assert [s.name for s in traj_view] == ["trajectory", "env.reset", "generate", "env.step", "generate",
                                           "reward", "buffer.wait"]
    assert traj_view[-1].end == 3.0


def test_timeline_caps_trajectories_and_needs_workers_for_loose_spans(tmp_path):
    tl = Timeline(start_time=0.0, max_trajectories=1)
    tl.add_trajectory(_trajectory("a", 0.0))
    tl.add_trajectory(_trajectory("b", 10.0))
    assert tl.dropped_trajectories == 1 and tl.trace()["otherData"]["dropped_trajectories"] == 1
    assert tl.trace()["otherData"]["trajectories"] == 1
    # utilisation still sees the capped trajectory; what ended before the window is forgotten
    assert len(tl.window_spans(5.0)) == 6  # b (past the cap), not a (ended at 3.0)
    tl.add_span(Span("train", 20.0, 21.0, "trainer/train/0"))
    assert [s.name for s in tl.window_spans(19.0)] == ["train"]
    with pytest.raises(ValueError, match="needs a worker"):
        tl.add_span(Span("train", 0, 1))


def test_load_trace_names_a_bad_file(tmp_path):
    bad = tmp_path / "timeline.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="timeline.json is not a Chrome trace"):
        load_trace(bad)


def test_marks_are_global_instants_that_round_trip_and_draw_on_both_gantt_charts(tmp_path):
    from rollart.observability import plots
    from rollart.observability.timeline import Mark

    tl = Timeline(start_time=1000.0)
    tl.add_trajectory(_trajectory("t0", 1000.0))
    tl.add_mark(Mark("worker died", 1001.5, "inference/gen_prefill/0", "SIGKILL"))
    tl.add_mark(Mark("worker joined", 1002.5, "inference/gen_prefill/0"))
    trace = json.loads(tl.write(RunPaths.of(tmp_path)).read_text())
    instants = [ev for ev in trace["traceEvents"] if ev["ph"] == "i"]
    assert [(ev["name"], ev["ts"], ev["s"], ev["cat"]) for ev in instants] == [
        ("worker died", 1_500_000, "g", "fault"), ("worker joined", 2_500_000, "g", "fault")]
    loaded = load_trace(tmp_path / "timeline.json")
    assert loaded.marks == (Mark("worker died", 1.5, "inference/gen_prefill/0", "SIGKILL"),
                            Mark("worker joined", 2.5, "inference/gen_prefill/0", ""))
    with_marks = plots.trajectory_gantt_png(loaded, 10)
    without = plots.trajectory_gantt_png(load_trace(Timeline(1000.0).write(RunPaths.of(tmp_path / "x"))), 10)
    assert with_marks and without is None  # (no trajectories: nothing to draw)
    assert plots.worker_gantt_png(loaded) != plots.worker_gantt_png(
        type(loaded)(loaded.spans, loaded.meta))  # the marks change the picture


def test_a_capped_trace_says_from_when_it_misses_trajectories_and_the_worker_chart_shows_it(tmp_path):
    from rollart.observability import plots

    tl = Timeline(start_time=0.0, max_trajectories=1)
    tl.add_trajectory(_trajectory("a", 0.0))
    tl.add_trajectory(_trajectory("c", 12.0))
    tl.add_trajectory(_trajectory("b", 10.0))  # dropped too, and started earlier: the cap counts from it
    tl.add_span(Span("train", 20.0, 21.0, "trainer/train/0"))
    capped = load_trace(tl.write(RunPaths.of(tmp_path / "capped")))
    assert capped.capped_at == 10.0 and capped.end == 21.0 and capped.meta["dropped_trajectories"] == 2
    whole = Timeline(start_time=0.0)
    whole.add_trajectory(_trajectory("a", 0.0))
    whole.add_span(Span("train", 20.0, 21.0, "trainer/train/0"))
    uncapped = load_trace(whole.write(RunPaths.of(tmp_path / "whole")))
    assert uncapped.capped_at is None
    # same spans; the capped one shades and labels the part after the cap
    assert plots.worker_gantt_png(capped) != plots.worker_gantt_png(uncapped)
