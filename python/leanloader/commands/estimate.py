"""`leanloader estimate`: seed 001's training-memory estimate for a model and machine."""

from __future__ import annotations

import argparse
import json
import math
import sys

from leanloader.planner import ARCHITECTURES, PLAN_KEYS, plan_memory

_LABELS = {
    "model_gb": "Model weights",
    "optimizer_gb": "Optimizer states",
    "ema_gb": "EMA model",
    "dop_gb": "Diff. output preservation",
    "gradient_checkpointing_savings_gb": "Gradient checkpointing",
    "workers_gb": "DataLoader workers",
    "os_reserve_gb": "OS reserve",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="estimate training memory, batch size and workers (seed 001's model)",
        description=(
            "Estimate the memory a diffusion-model training run needs and the batch size "
            "and DataLoader workers that fit (ai-toolkit's estimator, seed 001). Without "
            "--unified, SIZE is a discrete GPU's VRAM. Optimizer and EMA are charged as the "
            "seed does (AdamW = 2x the whole model, EMA = 1 GB) unless --training lora "
            "--rank R, --training full or --trainable-params N says what is trained."
        ),
    )
    parser.add_argument(
        "--model",
        required=True,
        choices=ARCHITECTURES,
        metavar="ARCH",
        help="architecture: " + ", ".join(ARCHITECTURES),
    )
    parser.add_argument(
        "--resolution",
        required=True,
        type=int,
        metavar="N",
        help="training resolution in pixels (N x N)",
    )
    parser.add_argument(
        "--memory",
        required=True,
        metavar="SIZE",
        help="120GB, 120 (GB), 96GiB, ... or 'auto' to read this machine "
        "(cgroup-aware; unified memory detected)",
    )
    parser.add_argument(
        "--unified",
        action="store_true",
        default=None,
        help="CPU and GPU share one memory pool (Apple Silicon, GB10, Grace, Jetson)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="DataLoader worker processes (default: the recommendation)",
    )
    parser.add_argument("--ema", action="store_true", help="keep an EMA copy of trained weights")
    parser.add_argument("--dop", action="store_true", help="differential output preservation")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--quantization", choices=("8bit", "4bit"))
    parser.add_argument(
        "--training",
        choices=("seed", "lora", "full"),
        default="seed",
        help="how optimizer and EMA are sized (default: as the seed)",
    )
    parser.add_argument("--rank", type=int, metavar="R", help="LoRA rank (with --training lora)")
    parser.add_argument(
        "--trainable-params",
        type=int,
        metavar="N",
        help="size optimizer and EMA from N trained parameters",
    )
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    parser.set_defaults(func=run)


def _gb(value: float) -> str:
    return f"{value:.1f} GB"


def _format_text(plan: dict, args: argparse.Namespace) -> str:
    kind = "unified memory" if plan["unified"] else "GPU memory (discrete)"
    lines = [
        f"{args.model} at {args.resolution}px on {plan['total_memory_gb']:.1f} GB {kind}",
        "",
    ]
    notes = {
        "model_gb": (f"{args.quantization} quantized" if args.quantization else ""),
        "optimizer_gb": (
            f"AdamW: 2 fp32 moments x {plan['trainable_params']:,} trained parameters"
            if plan["trainable_params"]
            else "AdamW: 2x model weights"
        ),
        "workers_gb": (
            f"{plan['workers']} workers x 8 GB" if plan["unified"] else "host RAM, not VRAM"
        ),
        "os_reserve_gb": "" if plan["unified"] else "host RAM, not VRAM",
    }
    for key, label in _LABELS.items():
        note = notes.get(key, "")
        lines.append(f"  {label:<27}{plan[key]:>8.1f} GB" + (f"   ({note})" if note else ""))
    lines.append("  " + "-" * 37)
    lines.append(f"  {'Total reserved':<27}{plan['reserved_gb']:>8.1f} GB")
    lines.append("")
    total, reserved = plan["total_memory_gb"], plan["reserved_gb"]
    available, per_sample = plan["available_for_batches_gb"], plan["per_sample_gb"]
    lines.append(
        f"Available for batches: ({total:g} - {reserved:g}) x 0.9 = {available:.1f} GB "
        "(10% safety margin)"
        if total >= reserved
        else f"Available for batches: 0 GB ({reserved:g} GB reserved > {total:g} GB)"
    )
    lines.append(f"Memory per sample at {args.resolution}px: {per_sample:.2f} GB")
    fit = math.floor(available / per_sample + 1e-9)
    shortfall = " (not enough memory!)" if fit == 0 else ""
    lines.append(f"Samples that fit: floor({available:.1f} / {per_sample:.2f}) = {fit}{shortfall}")
    if not plan["unified"]:
        lines.append("Batch sizes for a discrete GPU follow the seed's VRAM table by resolution.")
        if reserved > total:
            lines.append(
                "  note: the training state above exceeds the VRAM; it needs offloading, "
                "quantization or a LoRA-sized optimizer (--training lora --rank R)."
            )
    lines.append(
        f"Initial batch size: {plan['initial_batch_size']}    "
        f"Max batch size: {plan['max_batch_size']}    "
        f"Recommended workers: {plan['recommended_workers']}"
    )
    if plan["advice"]:
        lines.append("")
        lines.append("Optimizing for this system:")
        for number, item in enumerate(plan["advice"], 1):
            saves = item["saves_gb"]
            amount = f"{saves:.0f} GB" if abs(saves - round(saves)) < 1e-6 else f"~{saves:.1f} GB"
            detail = f" ({item['detail']})" if item["detail"] else ""
            lines.append(f"  {number}. {item['action']}: saves {amount}{detail}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.training == "lora" and not args.rank and not args.trainable_params:
        print(
            "leanloader estimate: --training lora needs --rank R (or --trainable-params N)",
            file=sys.stderr,
        )
        return 2
    try:
        plan = plan_memory(
            args.model,
            args.resolution,
            args.memory,
            unified=args.unified,
            workers=args.workers,
            ema=args.ema,
            dop=args.dop,
            gradient_checkpointing=args.gradient_checkpointing,
            quantization=args.quantization,
            training=args.training,
            rank=args.rank,
            trainable_params=args.trainable_params,
        )
    except (ValueError, RuntimeError) as error:
        print(f"leanloader estimate: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({key: _rounded(plan[key]) for key in PLAN_KEYS}, indent=2))
    else:
        print(_format_text(plan, args))
    return 0


def _rounded(value):
    # 11 * 0.9 is 9.900000000000002 in binary floating point; print what the seed prints.
    return round(value, 4) if isinstance(value, float) else value
