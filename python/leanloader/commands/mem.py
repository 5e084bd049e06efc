"""`leanloader mem`: RSS / PSS / private / shared memory of a process tree."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from leanloader.memory import BYTE_KEYS, memory_report

_MIB = 1 << 20


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mem",
        help="memory of a process tree: private vs shared vs file-backed",
        description=(
            "Per-process memory of PID and its descendants from /proc/PID/smaps_rollup: "
            "RSS, PSS, private (USS), the shared share (PSS - USS), anonymous, file-backed "
            "(page cache) and shmem, with totals that count each shared page once; shared "
            "memory held open by descriptors (unlinked /dev/shm files, memfds), a line per "
            "owning process, counted in unreclaimable once whether mapped or not; the "
            "system's MemTotal/MemAvailable, the cgroup's limit and usage, and GPU memory "
            "through NVML when the driver is present."
        ),
    )
    parser.add_argument(
        "--pid", type=int, help="root of the tree (default: the process that started this command)"
    )
    parser.add_argument(
        "--no-tree", dest="tree", action="store_false", help="only PID, not its descendants"
    )
    parser.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="sample every SECONDS until Ctrl-C, --count or the process exits",
    )
    parser.add_argument("--count", type=int, metavar="N", help="stop after N samples")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON (one object per line with --watch)",
    )
    parser.add_argument(
        "--plot", metavar="FILE.png", help="write a PNG of the totals over time (needs matplotlib)"
    )
    parser.set_defaults(func=run)


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / _MIB:,.1f}"


def format_report(report: dict) -> str:
    """The report as a table, MiB."""
    header = ("PID", "NAME", "RSS", "PSS", "PRIVATE", "SHARED", "ANON", "FILE", "SHMEM", "SWAP")
    rows = []
    for p in report["processes"]:
        rows.append(_row(str(p["pid"]), p["name"][:16], p))
    count = len(report["processes"])
    lines = [
        "memory in MiB; PRIVATE = USS, SHARED = PSS - USS (its share of shared pages), "
        "ANON/FILE/SHMEM split PSS",
        "".join(f"{h:>11}" if i != 1 else f"  {h:<16}" for i, h in enumerate(header)),
    ]
    lines += rows
    lines.append(_row("TOTAL", f"{count} process{'es' if count != 1 else ''}", report["total"]))
    lines.append(
        "  (totals sum PSS: each shared page counted once; RSS counts it in every process)"
    )
    total = report["total"]
    held = report.get("shared_files")
    if held is not None and held["num_files"]:
        lines.append(
            f"shared memory held by descriptors (unlinked /dev/shm files, memfds): "
            f"{held['num_files']} file{'s' if held['num_files'] != 1 else ''}, "
            f"{_mib(held['held_bytes'])} MiB, of which {_mib(held['unmapped_bytes'])} MiB "
            "in no page table of the tree (not in SHMEM)"
        )
        for owner in held["owners"]:
            lines.append(
                f"{owner['pid']:>11}  {owner['name'][:16]:<16} {owner['num_files']:>5} "
                f"segment{'s' if owner['num_files'] != 1 else ' '} {_mib(owner['held_bytes']):>11} "
                f"MiB held, {_mib(owner['unmapped_bytes'])} MiB not in SHMEM"
            )
    if "unreclaimable_bytes" in total:
        lines.append(
            f"unreclaimable: {_mib(total['unreclaimable_bytes'])} MiB "
            f"(ANON + SHMEM + {_mib(total['fd_shmem_bytes'])} MiB held by descriptors only)"
        )
    system = report["system"]
    lines.append(
        f"system: MemTotal {_mib(system['mem_total_bytes'])} MiB, "
        f"MemAvailable {_mib(system['mem_available_bytes'])} MiB"
    )
    cgroup = report["cgroup"]
    if cgroup is None:
        lines.append("cgroup: none found")
    else:
        limit = cgroup["memory_max_bytes"]
        lines.append(
            f"cgroup: limit {'none' if limit is None else _mib(limit) + ' MiB'}, "
            f"usage {_mib(cgroup['memory_current_bytes'])} MiB"
        )
    gpus = report["gpu"]
    if gpus is None:
        lines.append("gpu: unavailable (no NVIDIA driver / NVML)")
    else:
        for g in gpus:
            if g["memory_info_supported"]:
                lines.append(
                    f"gpu {g['index']}: {g['name']}: used {_mib(g['used_bytes'])} of "
                    f"{_mib(g['total_bytes'])} MiB"
                )
            else:
                lines.append(f"gpu {g['index']}: {g['name']}: shares system memory (unified)")
            tree = {p["pid"]: p["name"] for p in report["processes"]}
            for process in g.get("processes", []):
                if process["pid"] in tree:
                    used = process["used_bytes"]
                    amount = "unknown" if used is None else f"{_mib(used)} MiB"
                    lines.append(f"  pid {process['pid']} ({tree[process['pid']]}): {amount}")
    return "\n".join(lines)


def _row(pid: str, name: str, m: dict) -> str:
    shared = m["pss_bytes"] - m["uss_bytes"]
    values = (
        m["rss_bytes"], m["pss_bytes"], m["uss_bytes"], max(0, shared),
        m["pss_anon_bytes"], m["pss_file_bytes"], m["pss_shmem_bytes"], m["swap_bytes"],
    )  # fmt: skip
    return f"{pid:>11}  {name:<16}" + "".join(f"{_mib(v):>11}" for v in values)


def write_plot(path: str, times: list[float], totals: list[dict], title: str) -> None:
    """A PNG of the totals (MiB) over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5))
    series = (
        ("pss_bytes", "PSS (total)"),
        ("uss_bytes", "private (USS)"),
        ("pss_anon_bytes", "anonymous"),
        ("pss_file_bytes", "file-backed (page cache)"),
        ("pss_shmem_bytes", "shmem"),
        ("rss_bytes", "RSS (shared pages counted per process)"),
    )
    for key, label in series:
        axes.plot(
            times,
            [t[key] / _MIB for t in totals],
            label=label,
            linestyle="--" if key == "rss_bytes" else "-",
        )
    axes.set_xlabel("seconds")
    axes.set_ylabel("MiB")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run(args: argparse.Namespace) -> int:
    pid = args.pid if args.pid is not None else os.getppid()
    count = args.count if args.count is not None else (None if args.watch else 1)
    if count is not None and count < 1:
        print("leanloader mem: --count must be >= 1", file=sys.stderr)
        return 2
    times: list[float] = []
    totals: list[dict] = []
    start = time.monotonic()
    try:
        while True:
            try:
                report = memory_report(pid, tree=args.tree)
            except FileNotFoundError:
                if not times:
                    print(f"leanloader mem: no process {pid}", file=sys.stderr)
                    return 1
                break  # the watched process exited
            times.append(time.monotonic() - start)
            totals.append(report["total"])
            if args.json:
                print(json.dumps(report), flush=True)
            else:
                if args.watch and len(times) > 1:
                    print()
                print(format_report(report), flush=True)
            if count is not None and len(times) >= count:
                break
            time.sleep(args.watch or 0)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how --watch ends
    if args.plot:
        try:
            write_plot(args.plot, times, totals, f"memory of process tree {pid}")
        except ImportError:
            print(
                "leanloader mem: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr
            )
            return 2
        print(f"wrote {args.plot} ({len(times)} samples)", file=sys.stderr)
    return 0


__all__ = ["BYTE_KEYS", "add_parser", "format_report", "run", "write_plot"]
