"""Shared fixtures: short ipc endpoints, and producer processes that never outlive a test."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

# As bench_input.py has it (frameworks/tf_env.py), whichever test module imports TensorFlow first:
# TensorFlow reads its log level once, at import.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ipc_dir() -> Iterator[str]:
    """A short folder for ipc:// sockets (their paths are limited to about 100 bytes)."""
    with tempfile.TemporaryDirectory(prefix="fb-", dir="/tmp") as d:
        yield d


class Procs:
    """Starts project processes in their own session and kills the whole group at teardown."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, *args: str, **kw) -> subprocess.Popen:
        kw.setdefault("cwd", ROOT)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("text", True)
        p = subprocess.Popen([sys.executable, *args], start_new_session=True, **kw)
        self.started.append(p)
        return p

    def producer(self, endpoint: str, *extra: str) -> subprocess.Popen:
        return self.start("-m", "producers", "synthetic", "--endpoint", endpoint, "--quiet", *extra)

    def torch_zmq_consume(self, endpoint: str, out_json: Path) -> dict:
        """A short --framework torch zmq-consume run on one rank against producers at `endpoint`-r0 (12
        batches trained); its zmq-consume result, after checking the run succeeded."""
        run = self.start(
            "bench_input.py", "--framework", "torch", "--fake-location", "zmq-consume", "--endpoint", endpoint,
            "--input-only", "--num-gpus", "1", "--batch", "2", "--image-size", "4", "--warmup-steps", "2",
            "--steps", "5", "--repeats", "2", "--json", str(out_json),
        )  # fmt: skip
        _, err = run.communicate(timeout=360)
        assert run.returncode == 0, err[-3000:]
        return json.loads(out_json.read_text())["paths"]["zmq-consume"]

    def cleanup(self) -> None:
        """SIGTERM first, so producers remove their shared-memory regions and socket files; SIGKILL what stays."""
        for p in self.started:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.started:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the group: workers that outlived their launcher too
            except ProcessLookupError:
                pass
            p.wait()
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()


@pytest.fixture
def procs() -> Iterator[Procs]:
    ps = Procs()
    try:
        yield ps
    finally:
        ps.cleanup()


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def only_these_hold(endpoint: str, pid: int) -> bool:
    """Only process `pid` and its own children (a producer's forked workers carry its command line) still name
    `endpoint` on their command line: nothing of a run that used it is left."""
    holders = {p.pid for p in psutil.process_iter(["pid", "cmdline"]) if endpoint in " ".join(p.info["cmdline"] or [])}
    return holders == {pid, *(p.pid for p in descendants(pid))}


# ------------------------------------------------ shared memory left behind by this test process's children


def _listening_unix_paths() -> set[str]:
    """Paths of unix sockets some process still has bound (/proc/net/unix), to tell live files from leaks."""
    with open("/proc/net/unix") as f:
        next(f)
        return {parts[-1] for parts in (line.split() for line in f) if len(parts) >= 8}


def _mine(pid: int) -> bool:
    """A process this test process started (tests may run side by side under pytest-xdist), or one already gone."""
    try:
        p = psutil.Process(pid)
        return any(a.pid == os.getpid() for a in p.parents())
    except psutil.NoSuchProcess:
        return True


def private_dir() -> Path:
    """/tmp/feedbench-<uid>, created 0700; refused if another user owns it or others can enter."""
    from wire.shm import ShmError

    d = Path(f"/tmp/feedbench-{os.getuid()}")
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = d.lstat()
    if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ShmError(f"{d} must be a folder of yours that only you can enter (mode 0700)")
    return d


def regions_held_by(pid: int) -> list[str]:
    """Names of the regions process `pid` holds open or mapped (from /proc; [] once it has exited)."""
    names: set[str] = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            m = re.fullmatch(r"/memfd:(fb-[0-9]+-[0-9a-f]{32}) \(deleted\)", target)
            if m:
                names.add("/" + m.group(1))
    except OSError:
        return []
    return sorted(names)


class ShmLeaks:
    """Regions and socket files that appeared since `snapshot` and that nobody else can still be using.

    A region counts when its producer (the pid in its name) is gone or is one of ours; a socket file when no
    process has it bound, or it is one of `names`. Another test's live producer in a parallel worker is not ours.
    """

    def __init__(self, *names: str) -> None:
        from wire import shm

        self._shm = shm
        self.names = {f"{n}.sock" for n in names}
        self.before_regions, self.before_sockets = self._regions(), self._sockets()

    def _regions(self) -> set[str]:
        return {p.name for p in self._shm.SHM_DIR.glob("fb-*")}

    def _sockets(self) -> set[str]:
        return {p.name for p in private_dir().glob("*.sock")}

    def left(self) -> tuple[set[str], set[str]]:
        regions = {r for r in self._regions() - self.before_regions if _mine(int(r.split("-")[1]))}
        live = _listening_unix_paths()
        folder = private_dir()
        sockets = {s for s in self._sockets() - self.before_sockets if s in self.names or str(folder / s) not in live}
        return regions, sockets

    def assert_none_left(self, wait: float = 15.0) -> None:
        """Producers stopped at teardown may take a moment to exit: wait for them, then fail on what stays."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(self.left()):
            time.sleep(0.1)
        regions, sockets = self.left()
        assert regions == set(), f"shared-memory regions left behind: {sorted(regions)}"
        assert sockets == set(), f"socket files left behind: {sorted(sockets)}"


@pytest.fixture
def ep() -> Iterator[str]:
    """A fresh shm:// endpoint; the test fails if it leaves a region or a socket file behind."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    leaks = ShmLeaks(name)
    yield f"shm://{name}"
    leaks.assert_none_left()


@pytest.fixture
def tmpdir_env(ipc_dir: str) -> tuple[str, dict[str, str]]:
    """TMPDIR for the run: its folder (sockets, rank files) goes where the test can see it."""
    return ipc_dir, {**os.environ, "TMPDIR": ipc_dir}


# ------------------------------------------------ tests that compare rates: alone, and retried with the cause

TIMING_ATTEMPTS = 3  # a comparison spoiled by other work on the machine is measured again, at most this often
SERIAL_PHASE = "pytest -n0 -m timing"


def _busy_cpu_seconds() -> float:
    """CPU seconds the whole machine spent on anything but idling, since boot."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own_cpu_seconds() -> float:
    """CPU seconds of this test process and every process it started: reaped, and still running."""
    from profiler.cpu import tree_cpu_seconds

    return tree_cpu_seconds(os.getpid()) or 0.0


class MachineLoad:
    """How much CPU the rest of the machine took while a comparison ran: the cause to name when it fails."""

    def __enter__(self) -> MachineLoad:
        self.t0, self.busy0, self.own0 = time.monotonic(), _busy_cpu_seconds(), _own_cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = max(time.monotonic() - self.t0, 1e-9)
        other = (_busy_cpu_seconds() - self.busy0) - (_own_cpu_seconds() - self.own0)
        self.other_cores = max(other, 0.0) / self.wall

    def __str__(self) -> str:
        cores = len(os.sched_getaffinity(0))
        return (
            f"other work on the machine used {self.other_cores:.2f} of its {psutil.cpu_count()} cores "
            f"(this test may use {cores}) over the {self.wall:.1f} s it ran"
        )


def _measured_alone(test: Callable[..., object], name: str) -> Callable[..., object]:
    """Runs a rate comparison up to TIMING_ATTEMPTS times, stopping at the first pass; with the same tolerance
    each time. If every attempt fails, the failure lists each attempt's message beside the load it ran under."""

    @functools.wraps(test)
    def attempts(*args: object, **kwargs: object) -> object:
        failures = []
        for attempt in range(1, TIMING_ATTEMPTS + 1):
            with MachineLoad() as load:
                try:
                    return test(*args, **kwargs)
                except AssertionError as e:
                    failure = e
            failures.append(f"attempt {attempt}: {str(failure).splitlines()[0] if str(failure) else 'assert'}; {load}")
            print(f"{name}: {failures[-1]}", file=sys.stderr)
        raise AssertionError(
            f"{name}: the comparison failed {TIMING_ATTEMPTS} times; each attempt and the load it ran under:\n  "
            + "\n  ".join(failures)
        ) from failure

    return attempts


def pytest_configure(config: pytest.Config) -> None:
    if path := config.getoption("--record-durations", None):
        _record_to.append(Path(path))
    config.addinivalue_line(
        "markers", f"timing: compares rates, ratios or CPU shares; runs only alone (make test: {SERIAL_PHASE})"
    )
    if getattr(config, "workerinput", {}).get("workercount", 1) > 1:
        # Parallel workers outnumber the cores. A torch rank's OpenMP threads spin while they wait for work
        # (libgomp's default); with every core taken that spinning is CPU the other tests' processes wait for:
        # a one-rank torch run took 26 CPU-s beside two busy loops, 16 with passive waiting, 15.5 alone.
        # Threads that sleep while they wait compute the same results; the `timing` tests, which run alone,
        # keep the default.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# Seconds of each module's tests under `make test`'s parallel workers, as `make durations` recorded them
# (`--record-durations`). Handed out longest first (with --no-loadscope-reorder, as make test runs), the long
# modules end early and the many short ones fill the workers' last minutes, instead of one long module running
# on alone at the end. A module not recorded yet goes first of all: it may be a long one.
DURATIONS = Path(__file__).with_name("durations.json")
_recorded: dict[str, float] = {}
_record_to: list[Path] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations", metavar="PATH", help="write each test module's seconds (setup, call, teardown) to PATH"
    )


def _longest_first(items: list[pytest.Item]) -> None:
    """Stable-sort `items` by their module's recorded seconds, longest first; a module's own order is kept."""
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        seconds = {}
    items.sort(key=lambda item: -seconds.get(item.path.stem, float("inf")))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _record_to:
        module = Path(report.nodeid.split("::")[0]).stem
        _recorded[module] = _recorded.get(module, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The recorded seconds, longest first, written once by the process that saw every report (not a worker)."""
    if _record_to and not hasattr(session.config, "workerinput"):
        ranked = dict(sorted(((m, round(s, 1)) for m, s in _recorded.items()), key=lambda kv: -kv[1]))
        _record_to[0].write_text(json.dumps(ranked, indent=1) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A `timing` test compares rates or CPU shares: beside other tests' processes it would measure them, not
    the code. Under parallel workers it is skipped (`make test` runs these alone afterwards); alone, each is
    measured again when it fails, a bounded number of times, with the machine's load in the message."""
    _longest_first(items)
    # An xdist worker has `workerinput` (not an environment variable: a pytest run started by a test inherits
    # those, yet runs alone).
    parallel = getattr(config, "workerinput", {}).get("workercount", 1) > 1
    for item in items:
        if not item.get_closest_marker("timing") or not isinstance(item, pytest.Function):
            continue
        if parallel:
            item.add_marker(pytest.mark.skip(reason=f"compares rates: runs only alone ({SERIAL_PHASE})"))
        else:
            item.obj = _measured_alone(item.obj, item.name)


# Capacity probes of a 1 s warm-up and a 1 s window (the defaults are 3 s and 1.5 s), for the tests that check
# a search's files, labels and structure, not how a slow start is kept out of a probe: as BenchConfig fields,
# and as the command-line flags for those fields.
QUICK_PROBES = {"probe_warmup_s": 1.0, "probe_window_s": 1.0}
QUICK_PROBE_FLAGS = [a for field, v in QUICK_PROBES.items() for a in (f"--{field[:-2].replace('_', '-')}", f"{v:g}")]


@contextmanager
def taken_port() -> Iterator[int]:
    """A loopback TCP port this test process has bound and listens on: what another process's bind meets."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]
