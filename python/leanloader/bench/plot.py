"""`leanloader bench --plot`: samples/s and memory over time, a line per loader."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Samples/s is the slope of the delivered-samples curve over this window.
RATE_WINDOW_S = 0.5


def rate_over_time(
    samples: Sequence[tuple[float, int]], window_s: float = RATE_WINDOW_S
) -> list[tuple[float, float]]:
    """(time, samples/s) from (time, samples delivered so far) points: the
    samples delivered in the `window_s` before each point, per second (fewer
    seconds while the run is younger than the window)."""
    rates: list[tuple[float, float]] = []
    start = 0
    for at, count in samples:
        while start < len(samples) and samples[start][0] < at - window_s:
            start += 1
        base_at, base_count = (samples[start - 1]) if start > 0 else (0.0, 0)
        if at > base_at:
            rates.append((at, (count - base_count) / (at - base_at)))
    return rates


def plot_timelines(report: Mapping[str, Any], path: str | Path) -> None:
    """Writes a PNG: samples/s (top) and unreclaimable memory (bottom) over
    the seconds since each loader's process started, from the first round's
    memory pass. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timelines = report.get("timelines", {})
    figure, (rate_axis, memory_axis) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for name, timeline in timelines.items():
        rates = rate_over_time(timeline["samples"])
        (line,) = rate_axis.plot([t for t, _ in rates], [r for _, r in rates], label=name)
        memory = timeline["unreclaimable_bytes"]
        memory_axis.plot(
            [t for t, _ in memory], [v / 2**20 for _, v in memory], color=line.get_color()
        )
    rate_axis.set_ylabel(f"samples/s ({RATE_WINDOW_S:g} s window)")
    rate_axis.legend(fontsize="small", loc="best")
    rate_axis.set_title(f"leanloader bench {report['scenario']} ({report['size']})")
    memory_axis.set_ylabel("unreclaimable memory (MiB)")
    memory_axis.set_xlabel("seconds since the loader's process started")
    for axis in (rate_axis, memory_axis):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
