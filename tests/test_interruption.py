"""Every failure of the command line is one line naming its cause, in every phase, leaving nothing behind.

Real processes, real signals, real sockets: the run is started as a user
would start it, and its exit code, its stderr and its temporary folder are
checked afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import pytest
import zmq

pytestmark = pytest.mark.timeout(240)
SMALL = ["--num-gpus", "1", "--batch", "2", "--image-size", "32", "--input-only"]


def start(procs, tmp_path, *args: str, **kw) -> subprocess.Popen:
    """bench_input.py with its own TMPDIR, so what it leaves behind can be seen."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return procs.start("bench_input.py", *args, env={**os.environ, "TMPDIR": str(tmp)}, **kw)


def wait_for_line(p: subprocess.Popen, words: str, timeout: float = 180) -> list[str]:
    """Read the run's stdout until a line holds `words`; the lines read so far."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line)
        if words in line:
            return seen
    raise AssertionError(f"no line with {words!r}; got {''.join(seen)!r}")


def one_error(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


# --- output places and values, refused before anything starts ----------------------------------


def places(tmp_path) -> list[tuple[list[str], str]]:
    a_file = tmp_path / "plain"
    a_file.write_text("")
    cases = [
        (["--json", str(tmp_path)], "is a folder"),
        (["--json", str(tmp_path / "missing" / "r.json")], "no such folder"),
        (["--out", str(a_file)], "not a folder"),
    ]
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        cases.append((["--json", str(ro / "r.json")], "cannot write"))
    return cases


def test_output_places_that_cannot_be_written_are_refused_up_front(procs, tmp_path):
    for args, words in places(tmp_path):
        p = start(procs, tmp_path, *SMALL, *args)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2, (args, err)
        line = one_error(err)
        assert args[0] in line and words in line, line
        assert "feedbench:" not in out, "nothing may start before the places are checked"


@pytest.mark.parametrize(
    "flag, value",
    [("--recv-timeout", v) for v in ("0", "-1", "nan", "inf")] + [("--probe-warmup", "0"), ("--probe-window", "-1")],
)
def test_seconds_must_be_a_finite_number_above_zero(procs, tmp_path, flag, value):
    p = start(procs, tmp_path, *SMALL, flag, value)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    assert flag in one_error(err) and "finite number above 0" in err


def test_an_image_size_no_machine_can_hold_is_refused_saying_why(procs, tmp_path):
    p = start(procs, tmp_path, *SMALL, "--image-size", "200000")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2
    line = one_error(err)
    assert "--image-size 200000" in line and "GB available" in line
    assert "feedbench:" not in out


# --- signals in every phase ---------------------------------------------------------------------


def assert_interrupted(p: subprocess.Popen, sig: int, tmp_path) -> None:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err, err[-3000:]
    assert len([ln for ln in err.splitlines() if "interrupted" in ln]) == 1, err[-3000:]
    assert not list((tmp_path / "tmp").iterdir()), "the run's temporary files must be removed"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_baseline_is_one_line_and_the_signal_exit_code(procs, tmp_path, sig):
    p = start(procs, tmp_path, "--fake-location", "gpu", *SMALL, "--steps", "100000", "--repeats", "1")
    wait_for_line(p, "- gpu ...")
    time.sleep(2.0)
    p.send_signal(sig)
    assert_interrupted(p, sig, tmp_path)


def test_sigint_stops_a_run_started_with_sigint_ignored(procs, tmp_path):
    """`cmd &` in a script starts the run with SIGINT ignored; a deliberate SIGINT must still stop it."""
    p = start(
        procs, tmp_path, "--fake-location", "gpu", *SMALL, "--steps", "100000", "--repeats", "1",
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    wait_for_line(p, "- gpu ...")
    time.sleep(2.0)
    p.send_signal(signal.SIGINT)
    assert_interrupted(p, signal.SIGINT, tmp_path)


def test_a_signal_while_waiting_for_an_external_producer(procs, tmp_path, ipc_dir):
    p = start(procs, tmp_path, "--fake-location", "python-queue", *SMALL, "--warmup-steps", "1", "--steps", "1",
              "--repeats", "1", "--endpoint", f"ipc://{ipc_dir}/ext", "--recv-timeout", "600")  # fmt: skip
    wait_for_line(p, "waiting for an external producer")
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    assert_interrupted(p, signal.SIGTERM, tmp_path)


# --- input errors: one line naming the path, the endpoint and the field -------------------------


@pytest.mark.parametrize("path", ["zmq-consume", "python-queue", "python-dataset"])
def test_garbage_from_an_external_sender_is_one_line_naming_path_and_endpoint(procs, tmp_path, ipc_dir, path):
    endpoint = f"ipc://{ipc_dir}/ext"
    p = start(procs, tmp_path, "--fake-location", path, *SMALL, "--warmup-steps", "1", "--steps", "2",
              "--repeats", "1", "--endpoint", endpoint, "--recv-timeout", "60")  # fmt: skip
    wait_for_line(p, "waiting for an external producer")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        rng = np.random.default_rng(0)
        sock.send(rng.integers(0, 256, 64, dtype=np.uint8).tobytes())  # random bytes: no valid header
        out, err = p.communicate(timeout=90)
    finally:
        sock.close()
        ctx.term()
    assert p.returncode == 2, err[-3000:]
    assert "Traceback" not in out, out[-3000:]
    line = one_error(err)
    assert line.startswith(f"error: {path}: {endpoint}: "), line
    assert "no batch within" not in line, "the cause is the bad message, not a timeout"
