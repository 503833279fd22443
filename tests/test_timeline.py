"""The run's timeline (timeline.json and timeline.png beside --out's files): real runs of both trainers and a
loader-only run, sampled once a second, every step's images accounted for, the windows inside the run."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(400)

SMALL = ["--batch", "2", "--image-size", "32", "--warmup-steps", "2", "--steps", "3", "--repeats", "2"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(procs, *args: str, timeout: float = 300) -> str:
    p = procs.start("bench_input.py", *args)
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return out


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's header, after checking its signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def check_timeline(out: Path, stages: set[str], windows: list[str]) -> dict:
    """What every timeline must hold: one sample a second per stage, its CPU and memory, windows in the run."""
    doc = json.loads((out / "timeline.json").read_text())
    rows = doc["samples"]
    assert set(doc["stages"]) == stages and all(set(r["stages"]) >= stages for r in rows)
    times = [r["t"] for r in rows]
    gaps = [b - a for a, b in zip(times, times[1:-1])]  # the last sample is the run's end, part of a second
    assert len(rows) >= 3 and all(g > 0 for g in gaps) and sorted(gaps)[len(gaps) // 2] == pytest.approx(1.0, abs=0.1)
    for stage in stages:
        assert max(r["stages"][stage]["cpu_cores"] for r in rows) > 0, stage
        assert all(r["stages"][stage]["rss_mb"] > 0 for r in rows if r["stages"][stage]["processes"]), stage
    assert [w["label"] for w in doc["windows"]] == windows
    for w in doc["windows"]:
        assert 0 < w["start"] < w["end"] <= times[-1], w
    width, height = png_size(out / "timeline.png")
    assert width >= 3 * 400 and height >= len(stages) * 200
    return doc


def delivered(doc: dict, stage: str) -> float:
    """Images the timeline's per-second rates of `stage` add up to."""
    rows, before, total = doc["samples"], 0.0, 0.0
    for r in rows:
        total += r["stages"][stage].get("images_per_sec", 0.0) * (r["t"] - before)
        before = r["t"]
    return total


@pytest.mark.parametrize("framework", ["tf", "torch"])
def test_a_trainer_run_writes_its_timeline(procs, tmp_path, framework):
    """Producers feed python-queue after the gpu baseline: both stages sampled, every trained image counted."""
    if framework == "torch":
        pytest.importorskip("torch")
    out = tmp_path / "out"
    devices = 2 if framework == "torch" else 1
    # Producers capped at 8 images/s per worker: the python-queue path lasts a few seconds, long enough for the
    # producers to write their figures (once a second) and for the timeline to see them.
    run(procs, "--framework", framework, "--fake-location", "python-queue", "--num-gpus", str(devices),
        "--producers", "2", "--producer-rate", "8", "--input-only", *SMALL, "--out", str(out))  # fmt: skip
    doc = check_timeline(out, {"trainer", "producers"}, ["gpu", "gpu", "python-queue", "python-queue"])
    results = json.loads((out / "results.json").read_text())
    assert "clock" not in json.dumps(results)  # the step clocks went to the timeline, not the report
    trained = sum(r["steps_run"] for r in results["paths"].values()) * 2 * devices
    assert delivered(doc, "trainer") == pytest.approx(trained)
    assert max(r["stages"]["producers"].get("sent_images_per_sec", 0) for r in doc["samples"]) > 0
    assert max(r["stages"]["producers"]["processes"] for r in doc["samples"]) >= 2  # a producer and its worker
    if framework == "torch":  # python-queue's queue, as each step found it
        assert any("queue_occupancy" in r["stages"]["trainer"] for r in doc["samples"])


def test_a_loader_only_run_writes_its_timeline(procs, tmp_path):
    loader = tmp_path / "tiny_loader.py"
    loader.write_text(
        "import numpy as np\n\ndef batches():\n    while True:\n"
        "        yield np.ones((2, 8, 8, 3), np.uint8), np.arange(2)\n"
    )
    out = tmp_path / "out"
    run(procs, "--loader", f"{loader}:batches", "--loader-only", "--loader-workers", "2", "--loader-seconds", "2",
        "--no-stages", "--out", str(out))  # fmt: skip
    assert {p.name for p in out.iterdir()} >= {"loader.json", "loader.png", "timeline.json", "timeline.png"}
    doc = check_timeline(out, {"loader"}, ["1 worker(s)", "2 worker(s)"])
    assert max(r["stages"]["loader"]["processes"] for r in doc["samples"]) >= 3  # the sweep and its 2 workers
    assert max(r["stages"]["loader"].get("images_per_sec", 0) for r in doc["samples"]) > 0


def test_an_epoch_report_writes_its_timeline(procs, tmp_path):
    """--loader-only --epochs: each epoch a window, every batch of both epochs in the loader's images/s."""
    loader = tmp_path / "finite_loader.py"
    loader.write_text(
        "import time\nimport numpy as np\n\ndef batches():\n    for _ in range(800):\n        time.sleep(0.002)\n"
        "        yield np.ones((2, 8, 8, 3), np.uint8), np.arange(2)\n"
    )
    out = tmp_path / "out"
    run(procs, "--loader", f"{loader}:batches", "--loader-only", "--epochs", "2", "--out", str(out))
    assert {p.name for p in out.iterdir()} >= {"loader-epochs.json", "timeline.json", "timeline.png"}
    doc = check_timeline(out, {"loader"}, ["epoch 1", "epoch 2"])
    assert delivered(doc, "loader") == pytest.approx(2 * 800 * 2)


# A run with --json and no --out writes no timeline and no step clock: checked on the external-producer run of
# tests/test_tf_trainer.py, which is such a run (one TensorFlow launch fewer).


def test_cpu_of_processes_that_ended_between_samples_is_counted():
    """A DataLoader without persistent_workers starts and reaps its workers every pass: their CPU must be in
    the timeline as in --loader-only's figures (profiler/cpu.py), not lost with the process."""
    import resource
    import subprocess
    import sys

    from profiler.timeline import Timeline

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with Timeline("loader") as timeline:
        for _ in range(4):  # each one started, run and reaped between or across samples
            subprocess.run([sys.executable, "-c", burn], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    rows = timeline.document()["samples"]
    counted = sum(r["stages"]["loader"]["cpu_cores"] * (r["t"] - (rows[i - 1]["t"] if i else 0.0))
                  for i, r in enumerate(rows))  # fmt: skip
    assert children >= 1.2 and counted >= 0.95 * children, (counted, children)


def test_a_child_reaped_late_is_counted_once_and_no_row_passes_the_cores():
    """A worker that ends and waits, unreaped, over a few samples (a zombie) before its parent reaps it: its
    CPU is counted once, and never as the burst of a whole life in one short row (7.6 cores on 2 cores)."""
    import os
    import subprocess
    import sys
    import time

    from profiler.timeline import Timeline

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0:\n    pass\n"
    timeline = Timeline("loader", interval=0.2)
    start = os.times()
    with timeline:
        child = subprocess.Popen([sys.executable, "-c", burn])
        while psutil_status(child.pid) != "zombie":  # ended; not reaped yet
            time.sleep(0.05)
        time.sleep(0.6)  # a few samples see it as a zombie
        child.wait()
        time.sleep(0.5)  # a few samples after its reaping
    end = os.times()
    used = sum(end[:4]) - sum(start[:4])  # this process's CPU and its child's: the timeline's one stage
    doc = timeline.document()
    rows = doc["samples"]
    counted = sum(r["stages"]["loader"]["cpu_cores"] * (r["t"] - (rows[i - 1]["t"] if i else 0.0))
                  for i, r in enumerate(rows))  # fmt: skip
    assert used >= 1.0 and 0.85 * used <= counted <= 1.1 * used, (counted, used)
    assert doc["machine_cores"] == os.cpu_count()
    assert max(sum(s["cpu_cores"] for s in r["stages"].values()) for r in rows) <= doc["machine_cores"]


def psutil_status(pid: int) -> str:
    import psutil

    return psutil.Process(pid).status()


def _doc(queue_from: float, producers: bool) -> dict:
    """A timeline document as profiler/timeline.py writes it: the gpu path (no queue) for 4 s, then python-queue
    (a queue each step found) for 4 s, with two short windows each."""
    rows = []
    for t in range(1, 9):
        trainer = {"cpu_cores": 0.5, "rss_mb": 800.0, "processes": 1, "images_per_sec": 50.0}
        if t > queue_from:
            trainer["queue_occupancy"] = 3.0
        stages = {"trainer": trainer}
        if producers:
            stages["producers"] = {"cpu_cores": 0.0, "rss_mb": 0.0, "processes": 0}
        rows.append({"t": float(t), "stages": stages})
    windows = [{"label": p, "start": a, "end": a + 0.15} for p, a in
               (("gpu", 2.0), ("gpu", 2.3), ("python-queue", 6.0), ("python-queue", 6.3))]  # fmt: skip
    names = ["trainer", "producers"] if producers else ["trainer"]
    return {"interval_s": 1.0, "machine_cores": 2, "stages": names, "samples": rows, "windows": windows}


def test_the_timeline_draws_only_what_ran():
    """No producers' words in a run without producers; no queue occupancy over the path without a queue."""
    from profiler.timeline_plot import _columns, timeline_figure

    assert ("images_per_sec", "images/s") in _columns(_doc(4.0, producers=False))
    assert ("images_per_sec", "images/s (producers: sent)") in _columns(_doc(4.0, producers=True))
    fig = timeline_figure(_doc(4.0, producers=False))
    queue_pane = [ax for ax in fig.axes if ax.get_title() == "queue occupancy"][0]
    xs = [x for line in queue_pane.get_lines() for x, y in line.get_xydata() if y == y]
    assert xs and min(xs) >= 4.0, xs  # drawn from python-queue's first second on, not over gpu's


def test_the_timelines_path_labels_are_level_readable_and_apart():
    from profiler.timeline_plot import timeline_figure

    fig = timeline_figure(_doc(4.0, producers=True))
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes[:3]:  # the top row: the labels over the windows
        labels = [t for t in ax.texts if t.get_text() in ("gpu", "python-queue")]
        assert sorted(t.get_text() for t in labels) == ["gpu", "python-queue"]
        assert all(t.get_rotation() == 0 and t.get_fontsize() >= 9 for t in labels)
        boxes = [t.get_window_extent(renderer) for t in labels]
        assert not boxes[0].overlaps(boxes[1])
        assert all(ax.get_window_extent(renderer).contains(b.x0, b.y0) for b in boxes)


def test_a_row_too_short_or_without_a_step_gives_no_rate_of_its_own():
    """Recorded step ends of a busy machine's run: a row that came 0.1 s after a late one holds one step of 64
    images, and the run's last row is 0.05 s long with one step in it. Neither is 640 or 1,280 images/s: each is
    joined with its neighbour, which shares its rate; a row without a step has no rate (drawn as nothing); every
    image is still in the rates times the rows' lengths."""
    from profiler.timeline import Timeline

    timeline = Timeline("trainer")
    stages = {"trainer": {"cpu_cores": 0.5, "rss_mb": 100.0, "processes": 1}}
    timeline.samples = [{"t": t, "stages": stages} for t in (1.0, 1.9, 2.0, 3.0, 4.0, 4.05)]
    ends = [0.5, 1.5, 1.95, 2.5, 3.95, 4.02]  # a step in each row, the short ones included
    timeline.add_steps([timeline.t0 + t for t in ends], [64] * len(ends))
    rows = timeline.document()["samples"]
    rate = {r["t"]: r["stages"]["trainer"].get("images_per_sec") for r in rows}
    assert rate[1.9] == pytest.approx(64 / 0.9) and rate[1.0] == pytest.approx(64.0)
    assert rate[2.0] == pytest.approx(128 / 1.1) == rate[3.0]  # the 0.1 s row joined with the next
    assert rate[4.05] == pytest.approx(128 / 1.05) == rate[4.0]  # the last, 0.05 s, joined with the one before
    assert max(rate.values()) < 130
    assert delivered(timeline.document(), "trainer") == pytest.approx(64 * len(ends))
    timeline.samples += [{"t": t, "stages": stages} for t in (5.0, 6.0)]  # a second without a step after them
    rows = timeline.document()["samples"]
    assert "images_per_sec" not in rows[-1]["stages"]["trainer"]  # not measured, not 0
    assert rows[-3]["stages"]["trainer"]["images_per_sec"] == pytest.approx(64 / 1.0)  # 4.0-5.0: 4.05 not last now


def test_a_counted_stage_gets_no_rate_from_a_short_row_nor_from_a_row_without_a_batch():
    """--loader-only's counter ((images, batches) so far) read at recorded times of a busy machine: a burst of 2
    batches of 30 read 0.05 s after the row before is not 1,200 images/s; it shares the next row's time; a
    second in which the counter did not move has no rate."""
    from profiler.timeline import Timeline

    timeline = Timeline("loader")
    so_far = [(1.0, 0, 0), (1.95, 60, 2), (2.0, 120, 4), (3.0, 120, 4), (4.0, 180, 6)]
    timeline.samples = [
        {"t": t, "stages": {"loader": {"cpu_cores": 0.5, "rss_mb": 100.0, "processes": 2, "images_so_far": (n, b)}}}
        for t, n, b in so_far
    ]
    rate = {r["t"]: r["stages"]["loader"].get("images_per_sec") for r in timeline.document()["samples"]}
    assert rate[1.0] is None and rate[1.95] == pytest.approx(60 / 0.95)
    assert rate[2.0] == pytest.approx(60 / 1.05) == rate[3.0]  # the 0.05 s row joined with the next
    assert rate[4.0] == pytest.approx(60.0)
