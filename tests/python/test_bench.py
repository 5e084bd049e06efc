"""The benchmark harness, `leanloader bench` and `leanloader demo`, end to end
with tiny data. These check what the reports contain, not how fast anything is."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from leanloader.bench import harness
from leanloader.bench.scenarios import LoaderRun, Scenario, get_scenario, scenario_names

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="the baseline loader needs torch"
)

# 128 rows of 256 KiB: 32 MiB, two batches of 64 per epoch.
TINY_ROWS = 128


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leanloader.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("torch")
    data_dir = tmp_path_factory.mktemp("bench-data")
    # 3 rounds x 2 loaders x 2 passes (timing, memory): 12 child processes. torch
    # with fork workers runs in test_demo_runs_end_to_end; the fork server's
    # workers, grandchildren of the run, are the harder tree to account.
    completed = run_cli(
        "bench", "arrays", "--quick", "--json", "--data-dir", str(data_dir),
        "--set", f"rows={TINY_ROWS}", "--set", "epochs=2", "--set", "sweep=false",
        "--only", "leanloader,torch-forkserver", timeout=400,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_report_has_the_documented_keys(quick_report: dict) -> None:
    for key in ("scenario", "machine", "results", "ratios", "rounds", "goals"):
        assert key in quick_report
    assert quick_report["scenario"] == "arrays"
    assert quick_report["size"] == "quick"
    machine = quick_report["machine"]
    for key in ("cpu_model", "cpu_cores", "memory_total_bytes", "kernel", "python", "numpy"):
        assert machine[key]
    assert machine["torch"]


def _by_key(report: dict) -> dict:
    return {result.get("key", result["loader"]): result for result in report["results"]}


def test_every_loader_reports_every_figure(quick_report: dict) -> None:
    results = _by_key(quick_report)
    assert set(results) == {"leanloader", "torch-forkserver"}
    assert results["torch-forkserver"]["start_method"] == "forkserver"
    for result in results.values():
        assert result["rounds"] >= 3
        assert result["threads"] == 2
        assert result["samples"] == 2 * TINY_ROWS  # two epochs
        for figure in (
            "samples_per_s",
            "first_batch_s",
            "peak_unreclaimable_bytes",
            "steady_unreclaimable_bytes",
            "startup_peak_unreclaimable_bytes",
            "peak_pss_bytes",
            "cpu_s_per_1k_samples",
            "bytes_per_s",
            "memcpy_bytes_per_s",
            "fraction_of_memcpy",
        ):
            value = result[figure]
            assert math.isfinite(value) and value > 0, (result["loader"], figure, value)
        assert result["peak_pss_bytes"] >= result["peak_unreclaimable_bytes"]
        assert result["steady_unreclaimable_bytes"] <= result["peak_unreclaimable_bytes"]
        assert result["startup_peak_unreclaimable_bytes"] <= result["peak_unreclaimable_bytes"]
        assert 0 < result["start_unreclaimable_bytes"] <= result["peak_unreclaimable_bytes"]
    # The torch baseline runs worker processes and the sampler sees them.
    assert results["torch-forkserver"]["peak_processes"] >= 3
    assert results["leanloader"]["peak_processes"] == 1
    # Forkserver workers are the fork server's children; their CPU (each
    # imports torch: well over 0.3 s) must still be counted.
    forkserver = results["torch-forkserver"]
    assert forkserver["cpu_s_per_1k_samples"] * forkserver["samples"] / 1000 > 0.3


def test_ratios_divide_the_medians(quick_report: dict) -> None:
    results = _by_key(quick_report)
    for baseline in ("torch-forkserver",):
        ratios = quick_report["ratios"][f"leanloader/{baseline}"]
        for figure in (
            "samples_per_s",
            "first_batch_s",
            "peak_unreclaimable_bytes",
            "peak_pss_bytes",
        ):
            expected = results["leanloader"][figure] / results[baseline][figure]
            assert ratios[figure] == pytest.approx(expected)
        assert ratios["cpu_s_per_1k_samples"] > 0


def test_loader_order_rotates_each_round(quick_report: dict) -> None:
    rounds = quick_report["rounds"]
    assert len(rounds) >= 3
    runs = ["leanloader", "torch-forkserver"]
    for index, order in enumerate(rounds):
        shift = index % len(runs)
        assert order == runs[shift:] + runs[:shift]


def test_loader_names_are_unique_in_json(quick_report: dict) -> None:
    names = [result["loader"] for result in quick_report["results"]]
    assert len(names) == len(set(names)) == 2
    families = {result["loader"]: result["family"] for result in quick_report["results"]}
    assert families == {"leanloader": "leanloader", "torch-forkserver": "torch"}


def test_goals_are_checked(quick_report: dict) -> None:
    goals = quick_report["goals"]
    assert {goal["figure"] for goal in goals} == {
        "samples_per_s",
        "peak_unreclaimable_bytes",
        "first_batch_s",
        "fraction_of_memcpy",
        "fraction_of_fio_deep",  # measured with --cold only
        "cpu_s_per_1k_samples",
    }
    results = _by_key(quick_report)
    for goal in goals:
        if goal["of"] not in results and goal["of"] not in quick_report["ratios"]:
            # a run left out with --only (the row-size sweep, SPDL), or a figure of
            # --cold only: no value, not judged
            assert goal["value"] is None and goal["met"] is None
            continue
        if goal["figure"] == "fraction_of_fio_deep":
            assert goal["value"] is None and goal["met"] is None
            continue
        if "/" in goal["of"]:
            value = quick_report["ratios"][goal["of"]][goal["figure"]]
        else:
            value = results[goal["of"]][goal["figure"]]
        assert goal["value"] == pytest.approx(value)
        expected = (goal["at_least"] is None or value >= goal["at_least"]) and (
            goal["at_most"] is None or value <= goal["at_most"]
        )
        assert goal["met"] is expected


def test_the_consumer_reads_every_byte() -> None:
    import numpy as np

    from leanloader.bench.child import _read_every_byte, touch_batch

    def reference(data: bytes) -> int:
        # 64-bit little-endian words summed mod 2**64, then the tail bytes.
        words = len(data) // 8
        total = sum(int.from_bytes(data[8 * i : 8 * i + 8], "little") for i in range(words))
        return (total + sum(data[8 * words :])) % 2**64

    small = np.array([[1, 2], [3, 250]], dtype=np.uint8)
    assert _read_every_byte(small) == 256
    # Strided views are read in row-major order, every element's every byte.
    strided = np.arange(30, dtype=np.float32).reshape(3, 10)[:, ::2]
    assert _read_every_byte(strided) == reference(np.ascontiguousarray(strided).tobytes())
    wraps = np.full(21, 0xFF, dtype=np.uint8)  # two full words (they wrap) and 5 bytes
    assert _read_every_byte(wraps) == reference(wraps.tobytes())
    changed = strided.copy()
    changed[-1, -1] += 1
    assert _read_every_byte(changed) != _read_every_byte(strided)
    batch = {"a": np.zeros((4, 3), dtype=np.int64), "b": [np.ones(2, dtype=np.uint8)]}
    assert touch_batch(batch) == (4, 4 * 3 * 8 + 2)
    torch = pytest.importorskip("torch")
    tensor = torch.arange(30, dtype=torch.float32).reshape(3, 10)[:, ::2]
    assert _read_every_byte(tensor) == _read_every_byte(strided)
    assert _read_every_byte(torch.from_numpy(wraps)) == reference(wraps.tobytes())
    half = torch.arange(7, dtype=torch.bfloat16)  # no NumPy dtype: read as its bytes
    assert _read_every_byte(half) == reference(half.view(torch.uint8).numpy().tobytes())


def test_memory_phases_split_start_up_from_steady_state() -> None:
    sampler = harness.TreeMemorySampler(os.getpid())
    # Start-up peaks at 900 (a one-time move into shared memory), then the
    # epoch runs at 300-320.
    sampler.timeline = [(1.0, 100), (2.0, 900), (3.0, 300), (4.0, 320), (5.0, 310), (6.0, 50)]
    phases = sampler.phases(first_batch_wall=2.5, last_batch_wall=5.5)
    assert phases == {"startup_peak_unreclaimable_bytes": 900, "steady_unreclaimable_bytes": 310}
    # A run shorter than a sampling interval gets the closest sample.
    assert sampler.phases(4.1, 4.2)["steady_unreclaimable_bytes"] == 320


def test_data_is_generated_once_and_reused(tmp_path: Path) -> None:
    scenario = get_scenario("arrays")
    size = {"rows": 8, "epochs": 1}
    data = scenario.prepare(tmp_path, size)
    path = Path(data["path"])
    assert path.name == "features.npy"
    modified = path.stat().st_mtime_ns
    assert scenario.prepare(tmp_path, size) == data
    assert path.stat().st_mtime_ns == modified
    assert [p.name for p in path.parent.iterdir()] == ["features.npy"]  # no partial files left
    # the row-size sweep: the same bytes in rows of 4 KiB, 64 KiB and 4 MiB
    rows_by_kib = {
        int(kib): np.load(sweep_path, mmap_mode="r").shape
        for kib, sweep_path in data["paths_by_row_kib"].items()
    }
    assert rows_by_kib == {4: (512, 1024), 64: (32, 16384), 256: (8, 65536), 4096: (1, 1048576)}


@pytest.fixture(scope="module")
def cold_sweep_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One --cold run of the row-size sweep's 4 KiB row (one CLI run serves
    both tests below: each run is 6 child processes)."""
    pytest.importorskip("torch")
    data_dir = tmp_path_factory.mktemp("bench-cold")
    completed = run_cli(
        "bench", "arrays", "--quick", "--cold", "--json", "--data-dir", str(data_dir),
        "--set", f"rows={TINY_ROWS}", "--only", "leanloader-4KiB", timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout), data_dir


def test_row_size_sweep_reports_its_share_of_memcpy(cold_sweep_report: tuple) -> None:
    report, _ = cold_sweep_report
    (result,) = report["results"]
    assert result["row_kib"] == 4
    assert result["samples"] == TINY_ROWS * 64  # 4 KiB rows: 64 per 256 KiB row, one epoch
    assert 0 < result["fraction_of_memcpy"]
    (goal,) = [goal for goal in report["goals"] if "(4KiB rows)" in goal["goal"]]
    assert goal["value"] == result["fraction_of_memcpy"]


def test_cold_mode_evicts_the_data_and_measures_fio_beside_the_loader(
    cold_sweep_report: tuple,
) -> None:
    report, data_dir = cold_sweep_report
    assert report["cold"] is True
    assert "1 epoch" in report["description"] and "epochs" not in report["description"]
    (result,) = report["results"]
    # From a cold cache the rate counts the whole pass, first batch included
    # (the run's sample count is the same every round, so the median rate is
    # the count over the median time).
    assert result["samples_per_s"] == pytest.approx(result["samples"] / result["run_s"])
    assert result["first_batch_s"] < result["run_s"]
    # eviction works here (the harness drops the file before every pass)
    data_file = next(Path(data_dir).rglob("arrays-*x1024-float32/features.npy"))
    harness._evict([str(data_file)])
    completed_fincore = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(data_file)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if completed_fincore.returncode == 0:
        assert int(completed_fincore.stdout.split()[0]) < data_file.stat().st_size // 2
    if shutil.which("fio") is None:
        assert "fio_bytes_per_s" not in result
        return
    for name in ("fio", "fio_deep"):
        assert result[f"{name}_bytes_per_s"] > 0
        assert result[f"fraction_of_{name}"] == pytest.approx(
            result["bytes_per_s"] / result[f"{name}_bytes_per_s"]
        )
    assert "of fio" in harness.format_report(report)


def test_latents_cold_mode_gives_fio_a_shard_for_the_runs_that_read_shards() -> None:
    scenario = get_scenario("latents")
    assert scenario.cold_read is not None
    data = {"shards": ["/cache/shard-1.safetensors", "/cache/shard-2.safetensors"]}
    targets = {run.run_key: scenario.cold_read(data, run) for run in scenario.loaders}
    sample_bytes = 2 * (16 * 128 * 128) + 2 * (256 * 4096)
    for key in ("leanloader", "grain", "torchdata", "spdl"):
        path, block = targets[key]
        assert path == "/cache/shard-1.safetensors"
        assert block % 4096 == 0 and sample_bytes <= block < sample_bytes + 4096
    # torch's runs read one file per sample or RAM; the yardstick reads RAM
    assert targets["torch-ram"] is None and targets["torch-files"] is None
    assert targets["copy-and-read"] is None


def test_fewer_than_three_rounds_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rounds"):
        harness.run_scenario(get_scenario("arrays"), "quick", rounds=2, data_dir=tmp_path)
    completed = run_cli("bench", "arrays", "--rounds", "2", "--data-dir", str(tmp_path))
    assert completed.returncode != 0


def test_unknown_scenario_is_refused() -> None:
    assert "arrays" in scenario_names()
    with pytest.raises(ValueError, match="unknown scenario"):
        get_scenario("no-such-scenario")


def test_human_report_has_a_row_per_loader_and_ratio(quick_report: dict) -> None:
    text = harness.format_report(quick_report)
    lines = text.splitlines()
    assert lines[0].startswith("leanloader bench arrays (quick)")
    assert any(line.startswith("leanloader ") for line in lines)
    assert any(line.startswith("torch-forkserver ") for line in lines)
    assert any(line.startswith("leanloader/torch-forkserver ") for line in lines)
    assert "goals:" in text


@needs_torch
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    completed = run_cli("demo", "--dir", str(tmp_path), "--rows", "64")
    assert completed.returncode == 0, completed.stderr
    for text in ("samples per second", "time to first batch", "private memory", "file cache"):
        assert text in completed.stdout
    assert "torch DataLoader" in completed.stdout
    assert "leanloader vs torch" in completed.stdout


def test_demo_without_torch_shows_leanloader_alone(tmp_path: Path) -> None:
    # torch is hidden from the parent; the leanloader child then asks for
    # NumPy output and never imports torch either.
    program = (
        "import sys; sys.modules['torch'] = None\n"
        "from leanloader.cli import main\n"
        f"sys.exit(main(['demo', '--dir', {str(tmp_path)!r}, '--rows', '64']))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert completed.returncode == 0, completed.stderr
    assert "leanloader" in completed.stdout
    assert "torch DataLoader" in completed.stdout  # named in the note about the baseline
    assert "needs torch" in completed.stdout
    assert "samples per second" in completed.stdout


def test_scenario_run_keys_must_be_unique() -> None:
    arrays = get_scenario("arrays")
    torch_run = arrays.loader("torch")
    with pytest.raises(ValueError, match="unique"):
        Scenario(
            name="twice",
            description="",
            sizes=arrays.sizes,
            prepare=arrays.prepare,
            loaders=(torch_run, torch_run),
            ratios=(),
        )
    # A key tells two runs of one loader apart (e.g. at 2 and 4 workers).
    four_workers = LoaderRun(
        name="torch", function=torch_run.function, threads=4, options={"workers": 4}, key="torch-4"
    )
    scenario = Scenario(
        name="workers",
        description="",
        sizes=arrays.sizes,
        prepare=arrays.prepare,
        loaders=(torch_run, four_workers),
        ratios=(("torch-4", "torch"),),
    )
    assert scenario.loader("torch-4").threads == 4


def test_samples_per_second_by_epoch() -> None:
    from leanloader.bench.child import _per_epoch

    # first batch (10 samples) at t=1; epoch 1 ends at t=3 with 50 samples,
    # epoch 2 at t=7 with 90: 40 samples in 2 s, then 40 in 4 s (restart included)
    assert _per_epoch([(3.0, 50), (7.0, 90)], 1.0, 10, 99.0) == [20.0, 10.0]
    # an epoch of one batch has no time of its own: the whole run's rate
    assert _per_epoch([(1.0, 10)], 1.0, 10, 99.0) == [99.0]


def test_epoch_figures_have_medians_and_ratios() -> None:
    arrays = get_scenario("arrays")
    ours = LoaderRun(name="ours", function=arrays.loader("torch").function, threads=1)
    theirs = LoaderRun(name="theirs", function=ours.function, threads=1)
    scenario = Scenario(
        name="epochs", description="", sizes=arrays.sizes, prepare=arrays.prepare,
        loaders=(ours, theirs), ratios=(("ours", "theirs"),),
    )  # fmt: skip
    rows = [
        # (the child's list of rates rides along: not a figure)
        {"epoch1_samples_per_s": 4.0, "epoch2_samples_per_s": 6.0, "epoch_samples_per_s": [4, 6]},
        {"epoch1_samples_per_s": 2.0, "epoch_samples_per_s": [2.0]},
    ]
    assert harness._epoch_figures(rows) == ["epoch1_samples_per_s"]
    figures = {figure: 1.0 for figure in harness.RATIO_FIGURES}
    results = [
        {"loader": "ours", **figures, "epoch1_samples_per_s": 30.0, "epoch2_samples_per_s": 40.0},
        {"loader": "theirs", **figures, "epoch1_samples_per_s": 20.0, "epoch2_samples_per_s": 50.0},
    ]
    ratios = harness._ratios(scenario, results)["ours/theirs"]
    assert ratios["epoch1_samples_per_s"] == 1.5 and ratios["epoch2_samples_per_s"] == 0.8


def test_the_copy_and_read_yardstick_hands_out_every_batch_once() -> None:
    from leanloader.bench.scenarios.arrays import SCENARIO
    from leanloader.bench.yardstick import copied_batches, source_array

    source = source_array((4, 1024), np.float32, total_bytes=16 * 4 * 1024 * 4)
    assert len(source) == 16
    seen = []
    for batch in copied_batches(source, batches=40, threads=2):
        (value,) = set(batch.reshape(-1).view(np.uint8).tolist())  # one whole batch
        seen.append(value)
    # Batch k is source[k % 16], copied by thread k % 2, in any order.
    assert sorted(seen) == sorted(k % 16 for k in range(40))
    # Left early, its threads end (the generator's close waits for them).
    batches = copied_batches(source, batches=1000, threads=2)
    next(batches)
    batches.close()
    # The arrays bench compares leanloader with it.
    assert "copy-and-read" in {run.run_key for run in SCENARIO.loaders}
    assert ("leanloader", "copy-and-read") in SCENARIO.ratios


def test_memcpy_bandwidth_is_positive_and_checks_arguments() -> None:
    from leanloader import _core

    for threads in (1, 2):
        bytes_per_second = _core.measure_memcpy_bandwidth(threads, 1 << 20, 3)
        assert math.isfinite(bytes_per_second) and bytes_per_second > 0
    with pytest.raises(ValueError):
        _core.measure_memcpy_bandwidth(0)
    with pytest.raises(ValueError):
        _core.measure_memcpy_bandwidth(1, 1 << 20, 0)


def test_pydataset_ratios_carry_the_marginal_cost_of_a_worker():
    from leanloader.bench.scenarios import pydataset

    mib = 2**20

    def row(family, workers, steady, startup, rate, first, records="shared"):
        suffix = "" if records == "shared" else "-list"
        return {
            "loader": f"{family}{suffix}-{workers}",
            "family": family,
            "workers": workers,
            "records": records,
            "steady_unreclaimable_bytes": steady * mib,
            "startup_peak_unreclaimable_bytes": startup * mib,
            "peak_unreclaimable_bytes": max(steady, startup) * mib,
            "samples_per_s": rate,
            "first_batch_s": first,
        }

    results = [
        row("leanloader", 1, 300, 500, 900, 1.0),
        row("leanloader", 2, 320, 500, 1000, 1.0),
        row("leanloader", 4, 360, 500, 1100, 1.2),
        row("torch", 1, 900, 900, 400, 2.0),
        row("torch", 2, 1300, 1300, 500, 4.0),
        row("torch", 4, 2100, 2100, 500, 8.0),
        # The plain-list rows do not enter the slopes.
        row("leanloader", 2, 5000, 5000, 10, 9.0, records="list"),
        row("torch", 2, 100, 100, 10, 9.0, records="list"),
    ]
    ratios = pydataset.derive_ratios(results)["leanloader/torch"]
    assert set(ratios) == {
        "marginal_unreclaimable_per_worker",
        "marginal_startup_peak_per_worker",
        "steady_unreclaimable_bytes",
        "peak_unreclaimable_bytes",
        "samples_per_s",
        "first_batch_s",
    }
    # Steady state: 20 MiB per worker against 400; the start-up peak is flat.
    assert ratios["marginal_unreclaimable_per_worker"] == pytest.approx(20 / 400)
    assert ratios["marginal_startup_peak_per_worker"] == pytest.approx(0.0)
    assert ratios["steady_unreclaimable_bytes"] == pytest.approx(320 / 1300)
    assert ratios["peak_unreclaimable_bytes"] == pytest.approx(500 / 1300)
    assert ratios["samples_per_s"] == pytest.approx(2.0)
    assert ratios["first_batch_s"] == pytest.approx(0.25)
    assert pydataset.derive_ratios(results[:3]) == {}  # no baseline: nothing to divide


def test_timelines_cover_every_loader_and_plot(quick_report: dict, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from leanloader.bench.plot import plot_timelines

    timelines = quick_report["timelines"]
    assert set(timelines) == {row["loader"] for row in quick_report["results"]}
    for timeline in timelines.values():
        times = [at for at, _ in timeline["samples"]]
        counts = [count for _, count in timeline["samples"]]
        assert times == sorted(times) and counts == sorted(counts)
        assert counts[-1] > 0 and timeline["unreclaimable_bytes"]
    path = tmp_path / "bench.png"
    plot_timelines(quick_report, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rate_over_time_is_the_slope_over_the_window() -> None:
    from leanloader.bench.plot import rate_over_time

    # 100 samples every 0.1 s: 1,000 samples/s once the window is full.
    points = [(0.1 * (i + 1), 100 * (i + 1)) for i in range(20)]
    rates = rate_over_time(points, window_s=0.5)
    assert len(rates) == 20
    assert rates[0][1] == pytest.approx(1000.0)  # 100 samples in the first 0.1 s
    assert all(rate == pytest.approx(1000.0) for _, rate in rates)
    # A stall: nothing for 1 s, then a batch.
    stalled = [*points, (3.0, 2100)]
    assert rate_over_time(stalled, window_s=0.5)[-1][1] == pytest.approx(100 / 1.0)


def test_demo_ratios_below_a_tenth_keep_two_significant_digits() -> None:
    from leanloader.commands.demo import _times

    assert _times(0.0037) == "0.0037×"  # not "0.00×": 270 times sooner
    assert _times(0.09) == "0.09×"
    assert _times(0.79) == "0.79×"
    assert _times(6.6) == "6.60×"


def test_goals_show_what_the_yardstick_reaches_in_leanloaders_place() -> None:
    scenario = get_scenario("arrays")
    figures = {"samples_per_s": 0.0, "cpu_s_per_1k_samples": 0.0, "fraction_of_memcpy": 0.0}
    results = [
        {"loader": "leanloader", **figures, "samples_per_s": 300.0, "cpu_s_per_1k_samples": 0.6,
         "fraction_of_memcpy": 0.7},
        {"loader": "torchdata", **figures, "samples_per_s": 100.0, "cpu_s_per_1k_samples": 1.0},
        {"loader": "copy-and-read", **figures, "samples_per_s": 250.0,
         "cpu_s_per_1k_samples": 0.55, "fraction_of_memcpy": 0.65},
    ]  # fmt: skip
    ratios = {
        "leanloader/torchdata": {"samples_per_s": 3.0, "cpu_s_per_1k_samples": 0.6},
        "leanloader/torch": {"first_batch_s": 0.1},
    }
    checked = harness._check_goals(scenario.goals, results, ratios)
    goals = {goal["goal"]: goal for goal in checked}
    cpu = goals["CPU s per 1k samples ≤ ½ torchdata"]
    assert (cpu["value"], cpu["met"]) == (pytest.approx(0.6), False)
    assert (cpu["yardstick"], cpu["yardstick_value"]) == ("copy-and-read", pytest.approx(0.55))
    speed = goals["samples/s ≥ 2× torchdata"]
    assert (speed["value"], speed["yardstick_value"]) == (pytest.approx(3.0), pytest.approx(2.5))
    memcpy = goals["batch assembly ≥ 90% of memcpy (256 KiB rows)"]
    assert (memcpy["value"], memcpy["yardstick_value"]) == (pytest.approx(0.7), pytest.approx(0.65))
    # A goal whose peer did not run has no value, for leanloader or the yardstick.
    grain = goals["samples/s ≥ 2× Grain"]
    assert grain["value"] is None and grain["yardstick_value"] is None
    # Goals without a yardstick show none.
    assert goals["time to first batch ≤ ⅕ torch"]["yardstick"] is None

    (line,) = [line for line in harness.format_goals(checked) if "≤ ½ torchdata" in line]
    assert line.endswith("NOT met  (copy-and-read: 0.55)")
    # A cold pass: the yardstick copies from RAM, no ceiling for reads from storage.
    cold = harness._check_goals(scenario.goals, results, ratios, yardsticks=False)
    assert all(goal["yardstick_value"] is None for goal in cold)
