"""`leanloader bench yolo`: Ultralytics YOLO trained with torch's DataLoader and
through ``python -m leanloader.run``, side by side (issues 23 and 24's goals).

Needs Ultralytics and the torchvision it imports, which PyPI's torchvision
cannot give beside the project's torch: run it from its own environment,
``make bench-yolo`` (``.venv-yolo``: requirements-yolo.txt and leanloader).

The workload is a real training run, as a user starts it: a script *without*
an ``if __name__ == "__main__":`` guard (how Ultralytics' examples are
written) trains ``yolov8n.yaml`` from scratch on generated data (JPEGs written
by OpenCV, random boxes), imgsz 320, batch 16, two epochs, seed 0,
deterministic, on the CPU with 2 workers (Ultralytics sets 0 on a CPU; the
script sets 2 back, as a user with a slow disk would), once with no image cache
and once with ``cache="ram"`` (one uint8 tensor holding every resized image).
The same script runs as ``python script.py`` (torch's DataLoader, fork: Python
3.11's default on Linux) and as ``python -m leanloader.run script.py``
(``ll.DataLoader`` in place of torch's, its default start method).

Per run: the process tree's unreclaimable memory (sampled every 50 ms: the
peak, and the median from the first batch to the last), each epoch's time
from its start to its first batch, and a SHA-256 of every training batch
(images, classes, boxes) in order, which must be the same for both loaders.
Rounds alternate the order; medians and ratios are printed. Goals: peak and
first batch of a pass; identical batches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from leanloader.bench.harness import TreeMemorySampler, default_data_dir

IMAGES = 384
IMAGE_WIDTH, IMAGE_HEIGHT = 640, 480
CLASSES = ("circle", "box", "bar")
LOADERS = ("torch", "leanloader")
CACHES = ("none", "ram")

# The training script, unguarded on purpose: with workers that re-import
# `__main__` it would train again in every worker (issue 23).
SCRIPT = """\
import hashlib
import json
import os
import time

from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionTrainer

digest = hashlib.sha256()
timings = {"epoch_started": [], "first_batch_s": [], "batches": 0}
first_batch_wall = []
preprocess = DetectionTrainer.preprocess_batch


def hashing_preprocess(self, batch):
    for key in ("img", "cls", "bboxes", "batch_idx"):
        digest.update(batch[key].numpy().tobytes())
    return preprocess(self, batch)


DetectionTrainer.preprocess_batch = hashing_preprocess


def workers_back(trainer):
    trainer.args.workers = 2  # Ultralytics sets 0 on a CPU


def epoch_started(trainer):
    timings["epoch_started"].append(time.perf_counter())


def batch_started(trainer):
    if len(timings["first_batch_s"]) < len(timings["epoch_started"]):
        timings["first_batch_s"].append(time.perf_counter() - timings["epoch_started"][-1])
        if not first_batch_wall:
            first_batch_wall.append(time.time())
    timings["batches"] += 1


model = YOLO("yolov8n.yaml")
model.add_callback("on_pretrain_routine_start", workers_back)
model.add_callback("on_train_epoch_start", epoch_started)
model.add_callback("on_train_batch_start", batch_started)
cache = os.environ["YOLO_BENCH_CACHE"]
model.train(
    data=os.environ["YOLO_BENCH_DATA"], imgsz=320, batch=16, epochs=2, workers=2, device="cpu",
    cache=False if cache == "none" else cache, seed=0, deterministic=True, val=False,
    plots=False, amp=False, project=os.environ["YOLO_BENCH_PROJECT"], name="run",
    exist_ok=True, verbose=False,
)
last_batch_wall = time.time()
with open(os.environ["YOLO_BENCH_OUT"], "w") as out:
    json.dump({"first_batch_s": timings["first_batch_s"], "batches": timings["batches"],
               "digest": digest.hexdigest(), "first_batch_wall": first_batch_wall[0],
               "last_batch_wall": last_batch_wall}, out)
"""


def prepare(data_dir: Path, images: int = IMAGES) -> Path:
    """Writes `images` JPEGs (OpenCV) with YOLO labels and the data YAML, once."""
    import cv2
    import numpy as np

    root = data_dir / f"yolo-{images}"
    data_yaml = root / "data.yaml"
    if data_yaml.exists():
        return data_yaml
    image_dir, label_dir = root / "images" / "train", root / "labels" / "train"
    image_dir.mkdir(parents=True, exist_ok=True)
    label_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(images):
        image = rng.integers(0, 64, (IMAGE_HEIGHT, IMAGE_WIDTH, 3), dtype=np.uint8)
        lines = []
        for _ in range(int(rng.integers(1, 5))):
            cls = int(rng.integers(0, len(CLASSES)))
            w, h = (int(v) for v in rng.integers(40, 200, 2))
            x, y = int(rng.integers(0, IMAGE_WIDTH - w)), int(rng.integers(0, IMAGE_HEIGHT - h))
            colour = tuple(int(c) for c in rng.integers(100, 256, 3))
            if cls == 0:
                centre, axes = (x + w // 2, y + h // 2), (w // 2, h // 2)
                cv2.ellipse(image, centre, axes, 0, 0, 360, colour, -1)
            elif cls == 1:
                cv2.rectangle(image, (x, y), (x + w, y + h), colour, -1)
            else:
                cv2.rectangle(image, (x, y + h // 3), (x + w, y + 2 * h // 3), colour, -1)
            lines.append(
                f"{cls} {(x + w / 2) / IMAGE_WIDTH:.6f} {(y + h / 2) / IMAGE_HEIGHT:.6f} "
                f"{w / IMAGE_WIDTH:.6f} {h / IMAGE_HEIGHT:.6f}"
            )
        cv2.imwrite(str(image_dir / f"{i:05d}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
        (label_dir / f"{i:05d}.txt").write_text("\n".join(lines) + "\n")
    names = "".join(f"  {i}: {name}\n" for i, name in enumerate(CLASSES))
    partial = data_yaml.with_suffix(".tmp")
    partial.write_text(f"path: {root}\ntrain: images/train\nval: images/train\nnames:\n{names}")
    partial.replace(data_yaml)  # written last: its presence means the data is complete
    return data_yaml


def run_once(loader: str, cache: str, data_yaml: Path, work: Path) -> dict[str, Any]:
    """One training run in its own process tree, memory sampled."""
    script = work / "train_yolo.py"
    script.write_text(SCRIPT)
    out = work / f"{loader}-{cache}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, str(script)]
    if loader == "leanloader":
        command = [sys.executable, "-m", "leanloader.run", str(script)]
    environment = dict(os.environ)
    environment.update(
        YOLO_BENCH_DATA=str(data_yaml),
        YOLO_BENCH_CACHE=cache,
        YOLO_BENCH_OUT=str(out),
        YOLO_BENCH_PROJECT=str(work / "runs"),
        YOLO_CONFIG_DIR=str(work / "config"),
        YOLO_OFFLINE="1",
    )
    started = time.perf_counter()
    child = subprocess.Popen(
        command, cwd=work, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    sampler = TreeMemorySampler(child.pid)
    sampler.start()
    try:
        output, _ = child.communicate(timeout=1800)
    finally:
        sampler.stop()
    if child.returncode != 0 or not out.exists():
        tail = "\n".join(output.decode(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"{loader} cache={cache} failed ({child.returncode}):\n{tail}")
    figures = json.loads(out.read_text())
    figures.update(sampler.peaks)
    figures.update(sampler.phases(figures["first_batch_wall"], figures["last_batch_wall"]))
    figures["wall_s"] = time.perf_counter() - started
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="leanloader bench yolo", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--caches", default=",".join(CACHES))
    parser.add_argument("--data-dir", type=Path, default=default_data_dir())
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args(argv)
    caches = args.caches.split(",")
    data_yaml = prepare(args.data_dir)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="leanloader-yolo-") as work_dir:
        for round_index in range(args.rounds):
            order = LOADERS if round_index % 2 == 0 else tuple(reversed(LOADERS))
            for cache in caches:
                for loader in order:
                    figures = run_once(loader, cache, data_yaml, Path(work_dir))
                    results.setdefault((loader, cache), []).append(figures)
                    print(
                        f"round {round_index + 1} {loader:10s} cache={cache:4s} "
                        f"peak {figures['peak_unreclaimable_bytes'] / 2**20:7.0f} MiB  "
                        f"steady {figures['steady_unreclaimable_bytes'] / 2**20:7.0f} MiB  "
                        f"first batch {' '.join(f'{s:.3f}' for s in figures['first_batch_s'])} s",
                        file=sys.stderr,
                        flush=True,
                    )
    if args.json:
        args.json.write_text(
            json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}, indent=2)
        )
    failures = 0
    for cache in caches:
        ours, theirs = results[("leanloader", cache)], results[("torch", cache)]
        digests = {r["digest"] for r in ours + theirs}
        print(f"cache={cache}: {len(ours)} rounds each; batches identical: {len(digests) == 1}")
        failures += len(digests) != 1

        def median(runs: list[dict[str, Any]], key: str, epoch: int | None = None) -> float:
            values = [r[key] if epoch is None else r[key][epoch] for r in runs]
            return statistics.median(values)

        rows = [("peak unreclaimable MiB", "peak_unreclaimable_bytes", None, 2**20, 1.0)]
        rows.append(("steady unreclaimable MiB", "steady_unreclaimable_bytes", None, 2**20, None))
        rows += [(f"first batch, epoch {e + 1} s", "first_batch_s", e, 1, 1.5) for e in range(2)]
        # the whole run too: work moved out of the first batch's window shows here
        rows.append(("whole run s", "wall_s", None, 1, None))
        for label, key, epoch, unit, goal in rows:
            mine, base = median(ours, key, epoch), median(theirs, key, epoch)
            ratio = mine / base if base else float("inf")
            verdict = "" if goal is None else ("  met" if ratio <= goal else "  NOT met")
            goal_text = "" if goal is None else f" (goal ≤ {goal:g}×)"
            print(
                f"  {label:26s} leanloader {mine / unit:9.3f}  torch fork {base / unit:9.3f}  "
                f"{ratio:5.2f}×{goal_text}{verdict}"
            )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
