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
            "and DataLoader workers that fit (ai-toolkit's estimator, seed 001; needs --model, "
            "--resolution and --memory), or, with --sample, the host RAM, pinned memory and "
            "VRAM a loader configuration takes per component, leanloader's and torch "
            "DataLoader's with the same arguments (seed 004's calculation). Without "
            "--unified, SIZE is a discrete GPU's VRAM. Optimizer and EMA are charged as the "
            "seed does (AdamW = 2x the whole model, EMA = 1 GB) unless --training lora "
            "--rank R, --training full or --trainable-params N says what is trained."
        ),
    )
    parser.add_argument(
        "--model",
        choices=ARCHITECTURES,
        metavar="ARCH",
        help="architecture: " + ", ".join(ARCHITECTURES),
    )
    parser.add_argument(
        "--resolution",
        type=int,
        metavar="N",
        help="training resolution in pixels (N x N)",
    )
    parser.add_argument(
        "--memory",
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
    loader = parser.add_argument_group(
        "a loader configuration (with --sample)",
        "ll.Loader: (prefetch + 2) batch slots, page-locked in place with --device or "
        "--pin-memory; (prefetch-to-device + 2) batches on the device. ll.DataLoader "
        "(--dataloader) and torch: prefetch x workers batches in flight + 1 held, a process "
        "per worker (--worker-memory each); ll.DataLoader's pin_memory page-locks the batch "
        "segments in place, torch's copies each batch once more into page-locked memory; "
        ".to(device) holds the new and the old batch on the device.",
    )
    loader.add_argument(
        "--sample",
        action="append",
        metavar="NAME=DIMS:DTYPE",
        help="a field of one sample, e.g. fmri=150x150x100:float32 (repeat per field)",
    )
    loader.add_argument("--batch-size", type=int, metavar="N", help="samples per batch")
    loader.add_argument(
        "--prefetch", type=int, default=2, metavar="N", help="prefetch / prefetch_factor (2)"
    )
    loader.add_argument("--pin-memory", action="store_true", help="page-locked host batches")
    loader.add_argument("--device", metavar="cuda", help="batches go to this GPU")
    loader.add_argument("--prefetch-to-device", type=int, default=1, metavar="N")
    loader.add_argument(
        "--dataloader",
        action="store_true",
        help="leanloader's side is ll.DataLoader with --workers processes (else ll.Loader)",
    )
    loader.add_argument(
        "--worker-memory",
        default="500MB",
        metavar="SIZE",
        help="a worker process's own memory (Python, torch; default 500MB as seed 004)",
    )
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    parser.set_defaults(func=run)


def sample_bytes(specs: list[str]) -> int:
    """Bytes of one sample from NAME=DIMS:DTYPE specs; ValueError naming the bad part."""
    import numpy as np

    total = 0
    for spec in specs:
        name, equals, rest = spec.partition("=")
        dims, colon, dtype = rest.partition(":")
        if not equals or not colon or not name:
            raise ValueError(
                f"--sample {spec!r}: expected NAME=DIMS:DTYPE, e.g. x=3x224x224:float32"
            )
        try:
            shape = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise ValueError(
                f"--sample {spec!r}: dims {dims!r} are not numbers like 3x224x224"
            ) from None
        if any(d <= 0 for d in shape):
            raise ValueError(f"--sample {spec!r}: dims must be positive")
        try:
            itemsize = np.dtype(dtype).itemsize
        except TypeError:
            raise ValueError(f"--sample {spec!r}: unknown dtype {dtype!r}") from None
        total += math.prod(shape) * itemsize
    return total


def _mb(value: int) -> str:
    return f"{value / 1e6:,.0f} MB" if value else "-"


def _loader_table(title: str, rows: list[dict]) -> list[str]:
    lines = [title, f"  {'component':<52}{'host RAM':>12}{'pinned':>12}{'VRAM':>12}"]
    for row in rows:
        if row["component"] == "total":
            lines.append("  " + "-" * 88)
        lines.append(
            f"  {row['component']:<52}{_mb(row['host_bytes']):>12}"
            f"{_mb(row['pinned_bytes']):>12}{_mb(row['device_bytes']):>12}"
        )
    return lines


def run_loader(args: argparse.Namespace) -> int:
    from leanloader import _core

    try:
        if not args.batch_size or args.batch_size < 1:
            raise ValueError("--batch-size N (>= 1) is needed with --sample")
        batch = sample_bytes(args.sample) * args.batch_size
        workers = 2 if args.workers is None else args.workers
        worker_memory = _core.parse_byte_size(args.worker_memory)
        common = dict(batch_bytes=batch, prefetch=args.prefetch, pin_memory=args.pin_memory,
                      device=bool(args.device), prefetch_to_device=args.prefetch_to_device,
                      worker_process_bytes=worker_memory)  # fmt: skip
        ours = _core.plan_loader_memory(workers=workers if args.dataloader else 0, **common)
        theirs = _core.plan_loader_memory(workers=workers, **common)
    except (ValueError, RuntimeError) as error:
        print(f"leanloader estimate: {error}", file=sys.stderr)
        return 2
    result = {"batch_bytes": batch, "leanloader": ours["leanloader"], "torch": theirs["torch"]}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    side = f"ll.DataLoader, {workers} workers" if args.dataloader else "ll.Loader, native threads"
    extras = ", pin_memory" if args.pin_memory else ""
    extras += f", to {args.device}" if args.device else ""
    lines = [f"batch of {args.batch_size}: {_mb(batch)} ({', '.join(args.sample)})", ""]
    lines += _loader_table(f"leanloader ({side}, prefetch {args.prefetch}{extras})",
                           result["leanloader"])  # fmt: skip
    lines.append("")
    lines += _loader_table(
        f"torch DataLoader ({workers} workers, prefetch_factor {args.prefetch}{extras})",
        result["torch"],
    )
    print("\n".join(lines))
    return 0


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
    if args.sample:
        return run_loader(args)
    missing = [flag for flag, value in (("--model", args.model), ("--resolution",
               args.resolution), ("--memory", args.memory)) if value is None]  # fmt: skip
    if missing:
        print(
            f"leanloader estimate: the training estimate needs {', '.join(missing)} "
            "(or --sample ... for a loader configuration)",
            file=sys.stderr,
        )
        return 2
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
