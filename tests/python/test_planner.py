"""The estimator (seed 001) through Python and `leanloader estimate`."""

from __future__ import annotations

import json

import pytest

import leanloader as ll
from leanloader import _core
from leanloader.cli import main
from leanloader.planner import ARCHITECTURES, PLAN_KEYS, plan_memory

GIB = 1 << 30


def estimate_json(capsys, *args: str) -> dict:
    assert main(["estimate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_seed_example_qwen_image_2048_on_120gb_unified(capsys):
    out = estimate_json(
        capsys, "--model", "qwen_image", "--resolution", "2048", "--memory", "120GB",
        "--unified", "--workers", "2", "--ema",
    )  # fmt: skip
    assert list(out) == list(PLAN_KEYS)
    assert out == {
        "unified": True,
        "total_memory_gb": 120.0,
        "model_gb": 28.0,
        "optimizer_gb": 56.0,
        "ema_gb": 1.0,
        "dop_gb": 0.0,
        "workers_gb": 16.0,
        "os_reserve_gb": 8.0,
        "reserved_gb": 109.0,
        "available_for_batches_gb": 9.9,
        "per_sample_gb": 16.0,
        "max_batch_size": 1,
        "initial_batch_size": 1,
        "recommended_workers": 2,
    }


def test_seed_example_quantized_8bit_zero_workers(capsys):
    out = estimate_json(
        capsys, "--model", "qwen_image", "--resolution", "2048", "--memory", "120",
        "--unified", "--workers", "0", "--ema", "--quantization", "8bit",
    )  # fmt: skip
    assert out["model_gb"] == 14.0
    assert out["optimizer_gb"] == 28.0
    assert out["ema_gb"] == 1.0
    assert out["workers_gb"] == 0.0
    assert out["os_reserve_gb"] == 8.0
    assert out["reserved_gb"] == 51.0
    assert out["available_for_batches_gb"] == 62.1
    assert out["per_sample_gb"] == 16.0
    assert out["max_batch_size"] == 3
    assert out["initial_batch_size"] == 2


def test_seed_example_text_has_breakdown_and_advice(capsys):
    assert main([
        "estimate", "--model", "qwen_image", "--resolution", "2048", "--memory", "120GB",
        "--unified", "--workers", "2", "--ema",
    ]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "Total reserved" in text and "109.0 GB" in text
    assert "(120 - 109) x 0.9 = 9.9 GB" in text
    assert "floor(9.9 / 16.00) = 0 (not enough memory!)" in text
    assert "Initial batch size: 1    Max batch size: 1" in text
    assert "Optimizing for this system:" in text
    assert "1. Disable EMA: saves 1 GB (minor impact)" in text
    assert "2. Use 0 workers: saves 16 GB (2 workers x 8 GB)" in text
    assert "3. Enable gradient checkpointing: saves ~8.4 GB" in text
    assert "4. Enable quantization: saves 42 GB (reduces base model from 28 GB to ~14 GB" in text


@pytest.mark.parametrize(
    ("resolution", "vram", "initial", "maximum"),
    [
        (512, 24, 8, 16), (512, 8, 4, 8), (512, 80, 16, 32), (768, 24, 6, 12), (768, 4, 2, 4),
        (1024, 24, 4, 8), (1024, 12, 2, 4), (1024, 4, 1, 2), (1536, 24, 2, 4), (1536, 12, 1, 2),
        (2048, 24, 2, 4), (2048, 8, 1, 2),
    ],
)  # fmt: skip
def test_seed_discrete_table(capsys, resolution, vram, initial, maximum):
    out = estimate_json(
        capsys, "--model", "flux", "--resolution", str(resolution), "--memory", f"{vram}GB"
    )
    assert out["unified"] is False
    assert out["initial_batch_size"] == initial
    assert out["max_batch_size"] == maximum
    assert out["workers_gb"] == 0.0 and out["os_reserve_gb"] == 0.0


# (model, resolution, GB, workers, quantization, flags, reserved, initial, max), by hand.
UNIFIED_CASES = [
    ("flux", 1024, 128, 4, None, (), 112.0, 3, 3),
    ("sdxl", 512, 64, 0, None, (), 50.0, 12, 12),
    ("sd1", 768, 64, 2, "4bit", ("--gradient-checkpointing",), 27.6, 8, 14),
    ("qwen_image", 1536, 120, 0, "4bit", ("--ema", "--dop"), 33.0, 4, 8),
    ("chroma", 1024, 32, 0, None, (), 68.0, 1, 1),
    ("hidream", 2048, 128, 2, "8bit", (), 60.0, 2, 3),
    ("flux_kontext", 768, 96, 1, "8bit", ("--ema",), 53.0, 8, 16),
    ("omnigen2", 1024, 192, 4, "4bit", ("--dop", "--gradient-checkpointing"), 53.8, 4, 8),
    ("flex", 512, 48, 0, "8bit", (), 38.0, 9, 9),
    ("lumina2", 1536, 256, None, None, (), 106.0, 4, 8),
    ("sd3", 2048, 64, 0, None, (), 56.0, 1, 1),
    ("sd2", 768, 64, 0, None, (), 38.0, 8, 10),
]


@pytest.mark.parametrize(
    (
        "model",
        "resolution",
        "memory",
        "workers",
        "quant",
        "flags",
        "reserved",
        "initial",
        "maximum",
    ),
    UNIFIED_CASES,
)
def test_unified_cases(
    capsys, model, resolution, memory, workers, quant, flags, reserved, initial, maximum
):
    args = ["--model", model, "--resolution", str(resolution), "--memory", str(memory)]
    args += ["--unified", *flags]
    if workers is not None:
        args += ["--workers", str(workers)]
    if quant:
        args += ["--quantization", quant]
    out = estimate_json(capsys, *args)
    assert out["reserved_gb"] == pytest.approx(reserved)
    assert out["initial_batch_size"] == initial
    assert out["max_batch_size"] == maximum


def test_recommended_workers_by_total_memory():
    assert plan_memory("flux", 1024, 128, unified=True)["recommended_workers"] == 4
    assert plan_memory("flux", 1024, 127, unified=True)["recommended_workers"] == 2
    assert plan_memory("flux", 1024, 64, unified=True)["recommended_workers"] == 2
    assert plan_memory("flux", 1024, 63, unified=True)["recommended_workers"] == 0
    # Discrete: min(host RAM / 8 GB, CPUs, 8).
    discrete = plan_memory("flux", 1024, 24, host_memory_gb=64, cpu_count=6)
    assert discrete["recommended_workers"] == 6
    # Unset workers follow the recommendation: 4 x 8 GB on 128 GB.
    assert plan_memory("flux", 1024, 128, unified=True)["workers_gb"] == 32


def test_python_functions_mirror_the_seed():
    assert ll.batch_defaults(120, 2048, "qwen_image", 0, unified=True, ema=True,
                             quantization="8bit") == {
        "batch_size": 2,
        "auto_scale_batch_size": True,
        "min_batch_size": 1,
        "max_batch_size": 3,
        "batch_size_warmup_steps": 100,
    }  # fmt: skip
    # estimateVRAMUsage(modelArch, resolution, batchSize, quantization, gc, unified, workers, ema)
    assert ll.estimate_memory("qwen_image", 2048, 1, None, False, True, 2, True) == 125.0
    assert ll.estimate_memory("qwen_image", 2048, 0, "8bit", False, True, 0, True) == 51.0
    assert ll.estimate_memory("flux", 1024, 2) == 24 + 48 + 8  # discrete: no workers, no OS
    cost = ll.regularization_cost("qwen_image", True, True, True)
    assert cost["ema_gb"] == 1.0
    assert cost["diff_output_preservation_gb"] == 3.0
    assert cost["gradient_checkpointing_savings_gb"] == pytest.approx(-8.4)
    assert ll.regularization_cost("sdxl", False, False, False) == {
        "ema_gb": 0.0,
        "diff_output_preservation_gb": 0.0,
        "gradient_checkpointing_savings_gb": 0.0,
    }


def test_architectures_are_the_seeds():
    assert ARCHITECTURES == (
        "sd1", "sd2", "sdxl", "sd3", "flux", "flux_kontext", "flex", "chroma", "lumina2",
        "hidream", "omnigen2", "qwen_image",
    )  # fmt: skip
    weights = {a["name"]: a["weights_gb"] for a in _core.model_architectures()}
    assert weights["qwen_image"] == 28 and weights["sd1"] == 8 and weights["flux"] == 24


def test_lora_rank_sizes_optimizer_from_trained_parameters(capsys):
    out = estimate_json(
        capsys, "--model", "flux", "--resolution", "1024", "--memory", "128GB", "--unified",
        "--workers", "4", "--ema", "--training", "lora", "--rank", "16",
    )  # fmt: skip
    params = 3.5e6 * 16
    assert out["optimizer_gb"] == pytest.approx(params * 8 / GIB, abs=1e-4)
    assert out["ema_gb"] == pytest.approx(params * 4 / GIB, abs=1e-4)
    assert out["initial_batch_size"] == 4 and out["max_batch_size"] == 8
    seed = estimate_json(
        capsys, "--model", "flux", "--resolution", "1024", "--memory", "128GB", "--unified",
        "--workers", "4", "--ema",
    )  # fmt: skip
    assert seed["optimizer_gb"] == 48.0 and seed["max_batch_size"] == 3


def test_trainable_params_and_full_fine_tune(capsys):
    out = estimate_json(
        capsys, "--model", "sdxl", "--resolution", "1024", "--memory", "128", "--unified",
        "--workers", "0", "--ema", "--trainable-params", "1000000000",
    )  # fmt: skip
    assert out["optimizer_gb"] == pytest.approx(8e9 / GIB, abs=1e-4)
    assert out["ema_gb"] == pytest.approx(4e9 / GIB, abs=1e-4)
    full = estimate_json(
        capsys, "--model", "sdxl", "--resolution", "1024", "--memory", "128", "--unified",
        "--workers", "0", "--ema", "--training", "full",
    )  # fmt: skip
    assert full["optimizer_gb"] == 28.0 and full["ema_gb"] == 14.0


def test_lora_without_rank_is_an_error(capsys):
    code = main(["estimate", "--model", "flux", "--resolution", "1024", "--memory", "64",
                 "--training", "lora"])  # fmt: skip
    assert code == 2
    assert "--rank" in capsys.readouterr().err


def test_bad_memory_size_and_model(capsys):
    assert main(["estimate", "--model", "flux", "--resolution", "1024", "--memory", "12XB"]) == 2
    assert "12XB" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["estimate", "--model", "sd4", "--resolution", "1024", "--memory", "64"])
    with pytest.raises(ValueError, match="sd4"):
        plan_memory("sd4", 1024, 64)
    with pytest.raises(ValueError, match="resolution"):
        plan_memory("flux", 0, 64)


def test_memory_auto_unified_reads_the_cgroup_aware_total(capsys):
    out = estimate_json(
        capsys, "--model", "sd1", "--resolution", "512", "--memory", "auto", "--unified"
    )
    assert out["unified"] is True
    assert out["total_memory_gb"] == pytest.approx(_core.total_memory_bytes() / GIB, abs=1e-3)
    with open("/proc/meminfo") as meminfo:
        mem_total_kb = int(meminfo.readline().split()[1])
    assert out["total_memory_gb"] <= mem_total_kb * 1024 / GIB + 1e-3


def test_memory_auto_detects_unified_through_the_override(capsys, monkeypatch):
    monkeypatch.setenv("LEANLOADER_UNIFIED_MEMORY", "1")
    out = estimate_json(capsys, "--model", "sd1", "--resolution", "512", "--memory", "auto")
    assert out["unified"] is True
    monkeypatch.setenv("LEANLOADER_UNIFIED_MEMORY", "0")
    if _core.gpu_memory():
        pytest.skip("this machine has an NVIDIA GPU: auto reads its VRAM")
    code = main(["estimate", "--model", "sd1", "--resolution", "512", "--memory", "auto"])
    assert code == 2
    assert "no GPU memory" in capsys.readouterr().err


# -- a loader configuration (seed 004's hand calculation) ---------------------

SEED_004 = ["--sample", "fmri=150x150x100:float32", "--sample", "image=3x425x425:float32",
            "--batch-size", "32", "--workers", "4", "--prefetch", "2"]  # fmt: skip


def totals(rows: list[dict]) -> dict:
    assert rows[-1]["component"] == "total"
    return rows[-1]


def test_loader_estimate_of_seed_004_by_hand(capsys):
    out = estimate_json(capsys, *SEED_004, "--pin-memory", "--device", "cuda")
    batch = 32 * (150 * 150 * 100 * 4 + 3 * 425 * 425 * 4)
    assert out["batch_bytes"] == batch == 357_360_000  # the seed's "~357 MB per batch"
    worker = 500 * 10**6  # --worker-memory 500MB
    torch_total = totals(out["torch"])
    # 8 batches in the workers + 1 held, 9 page-locked copies, 4 workers; 2 on the GPU.
    assert torch_total["host_bytes"] == 9 * batch + 9 * batch + 4 * worker
    assert torch_total["pinned_bytes"] == 9 * batch
    assert torch_total["device_bytes"] == 2 * batch
    ours = totals(out["leanloader"])
    # ll.Loader: prefetch + 2 slots, page-locked in place; prefetch_to_device + 2 on the GPU.
    assert ours == {"component": "total", "host_bytes": 4 * batch, "pinned_bytes": 4 * batch,
                    "device_bytes": 3 * batch}  # fmt: skip
    out = estimate_json(capsys, *SEED_004, "--dataloader")
    assert totals(out["leanloader"])["host_bytes"] == 9 * batch + 4 * worker
    # With pin_memory the same 9 segments are page-locked in place (torch: 9 copies more).
    out = estimate_json(capsys, *SEED_004, "--dataloader", "--pin-memory")
    assert totals(out["leanloader"])["host_bytes"] == 9 * batch + 4 * worker
    assert totals(out["leanloader"])["pinned_bytes"] == 9 * batch
    assert totals(out["torch"])["host_bytes"] == 18 * batch + 4 * worker


def test_loader_estimate_text_names_every_component(capsys):
    assert main(["estimate", *SEED_004, "--pin-memory", "--device", "cuda"]) == 0
    text = capsys.readouterr().out
    for words in ["batch slots (prefetch + 2)", "device blocks (prefetch_to_device + 2)",
                  "pin_memory copies", "worker processes", "357 MB"]:  # fmt: skip
        assert words in text


@pytest.mark.parametrize(
    "spec,match",
    [("fmri150x150:float32", "NAME=DIMS:DTYPE"), ("x=3xA:float32", "not numbers"),
     ("x=3x0:float32", "positive"), ("x=3x3:float99", "unknown dtype")],
)  # fmt: skip
def test_loader_estimate_names_a_bad_sample_spec(capsys, spec, match):
    assert main(["estimate", "--sample", spec, "--batch-size", "4"]) == 2
    assert match in capsys.readouterr().err


def test_training_estimate_still_needs_its_arguments(capsys):
    assert main(["estimate", "--model", "flux"]) == 2
    assert "--resolution, --memory" in capsys.readouterr().err
