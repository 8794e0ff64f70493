"""The report's plots read right: each span kind its own colour, the step-time bars add up to the step and
are never clipped, legends sit outside the data, and noisy per-step curves get a moving mean."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rollart.observability import plots

# every span name the planes emit (a Gantt chart or the phase panel may draw any of them side by side)
SPANS = ("env.reset", "generate", "generate.wait", "env.step", "agent.step", "reward", "buffer.wait", "train",
         "weights.sync", "get_batch.wait", "warm_start", "other")


def test_every_span_kind_has_a_colour_of_its_own() -> None:
    colours = [plots.colour(name) for name in SPANS]
    assert len(set(colours)) == len(SPANS), dict(zip(SPANS, colours))


def test_the_driver_bars_add_up_to_the_step_and_the_train_step_is_drawn_beside() -> None:
    # the default mode: the train step (and its weight sync) run inside the wait, so they must not be stacked
    records = [{"step": 0, "time/step": 10.0, "time/get_batch_wait": 9.0, "time/train": 7.0,
                "time/weights.exposed": 0.5},
               {"step": 1, "time/step": 30.0, "time/get_batch_wait": 4.0, "time/train": 3.0}]  # an evaluation
    parts, beside = plots.driver_step_parts(records)
    assert [sum(values) for values in zip(*parts.values())] == [10.0, 30.0]
    assert beside == {"train step": [7.0, 3.0], "weight sync (generation suspended)": [0.5, 0.0]}


def test_stacked_bars_are_whole_and_the_legend_covers_none() -> None:
    fig = Figure(figsize=(6, 3))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    steps = [0.0, 1.0, 2.0]
    plots._stacked(ax, steps, {"a": [1.0, 30.0, 2.0], "b": [2.0, 5.0, 1.0]}, "t", "s", lines={"c": [40.0, 1.0, 1.0]})
    assert ax.get_ylim()[1] >= 40.0  # the tallest bar (35) and line point (40) are inside the axes
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend, axes = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.y1 <= axes.y0  # below the plotting area, over no bar


def test_noisy_curves_get_a_moving_mean() -> None:
    assert plots.moving_mean([0.0, 3.0, 0.0, 3.0, 0.0], 3) == [1.5, 1.0, 2.0, 1.0, 1.5]
    assert plots.smoothing_window(5) == 1 and plots.smoothing_window(20) == 3 and plots.smoothing_window(300) == 31
    records = [{"step": s, "wall_s": float(s), "env/math/reward": float(s % 2)} for s in range(40)]
    smooth = plots.domain_metric_png(records, "env/", "/reward", "training reward", smooth=True)
    raw = plots.domain_metric_png(records, "env/", "/reward", "training reward")
    assert smooth and raw and smooth != raw
