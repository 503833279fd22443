"""A TensorFlow cluster task listens only on the address its host:port names.

TensorFlow 2.21's server (`tf.compat.v1.train.Server`, `tf.distribute.Server`)
has no bind-address option: its gRPC server listens on the wildcard address
of the task's port, so a task of a loopback cluster would accept connections
from every interface, and TensorFlow's cluster protocol has no
authentication (whoever reaches the port can run any graph in the task). So
each task process is started with a small preloaded library
(`runner/native/bind_host.c`) that makes that one bind() on the task's own
address instead. It is built with the system's C compiler on first use, into
a per-user cache, under a file lock.

A host that is not loopback needs --allow-remote; after the server starts,
the task checks with the kernel (/proc/net/tcp) that it listens where it
should (`check_listening`).

Neutral: no TensorFlow here; the launcher and bench_input.py use it before
TensorFlow starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from core.errors import ConfigError, FeedbenchError
from core.native_flags import compile_flags, link_flags

SOURCE = Path(__file__).resolve().parent / "native" / "bind_host.c"
ENV_HOST = "FEEDBENCH_BIND_HOST"
ENV_PORT = "FEEDBENCH_BIND_PORT"


def split(host_port: str) -> tuple[str, int]:
    """`host:port` / `[v6]:port` -> (host without brackets, port)."""
    host, _, port = host_port.rpartition(":")
    return host.strip("[]"), int(port)


def resolve(host: str) -> str:
    """The numeric address a task's host names (the first the resolver gives; IPv4 first)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ConfigError(f"cluster host {host!r}: cannot resolve it ({e.strerror})") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return str(infos[0][4][0])


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def check_address(flag: str, host_port: str, allow_remote: bool) -> str:
    """The address a task on `host_port` listens on; ConfigError for one beyond loopback without --allow-remote."""
    address = resolve(split(host_port)[0])
    if not is_loopback(address) and not allow_remote:
        raise ConfigError(
            f"{flag} {host_port}: this task would listen on {address}, beyond this machine, and TensorFlow's "
            "cluster protocol has no authentication (anyone who reaches the port can run any graph in the task); "
            "pass --allow-remote on a network you trust (docs/cluster.md)"
        )
    return address


def _private(path: Path, what: str) -> Path:
    """`path` itself (not a link) owned by this user and writable by no one else; ConfigError otherwise.

    The library built there is preloaded into every cluster task: a folder or a file another user can
    write (a /tmp/feedbench-UID made in advance, say) would let them plant code that runs as this user.
    """
    st = path.lstat()
    problem = None
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif st.st_uid != os.getuid():
        problem = f"belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        raise ConfigError(f"{what} {path} {problem}: refusing to preload a library from it into the cluster's tasks")
    return path


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = Path(base) / "feedbench"
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return _private(d, "the cache folder")
    except OSError:
        pass
    d = Path(tempfile.gettempdir()) / f"feedbench-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    return _private(d, "the cache folder")


def library_name() -> str:
    """The built shim's file name: a new one for each source and flags it is built from."""
    made_of = SOURCE.read_bytes() + " ".join(compile_flags() + link_flags()).encode()
    return f"bind_host-{hashlib.sha256(made_of).hexdigest()[:16]}.so"


def library() -> str:
    """The built shim (built now if this source has not been built yet); ConfigError without a C compiler."""
    d = _cache_dir()
    lib = d / library_name()
    if lib.exists():
        return str(_private(lib, "the library"))
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise ConfigError(
            "a cluster task listens only on its own address through a small library built with a C compiler, "
            "and there is none here (install gcc, or pass --allow-remote to let TensorFlow listen on every interface)"
        )
    with open(d / "bind_host.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several tasks start at once: one builds, the others wait for it
        if lib.exists():
            return str(_private(lib, "the library"))
        tmp = d / f".bind_host-{os.getpid()}.so"
        out = subprocess.run(
            [cc, "-O2", *compile_flags(), "-Werror", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-ldl",
             *link_flags()],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if out.returncode != 0:
            with contextlib.suppress(OSError):
                tmp.unlink()
            last = (out.stderr.strip().splitlines() or ["?"])[-1]
            raise ConfigError(f"cannot build {SOURCE.name} with {cc}: {last}")
        os.replace(tmp, lib)
    return str(lib)


def task_env(host_port: str, address: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a task process that must listen on `address` (the port of `host_port`) only."""
    env = dict(os.environ if env is None else env)
    preload = env.get("LD_PRELOAD", "")
    lib = library()
    if lib not in preload.split():
        env["LD_PRELOAD"] = f"{lib} {preload}".strip()
    env[ENV_HOST] = address
    env[ENV_PORT] = str(split(host_port)[1])
    return env


def is_set_up(host_port: str, address: str) -> bool:
    """Whether this process was started to listen on `address` for `host_port`."""
    return os.environ.get(ENV_HOST) == address and os.environ.get(ENV_PORT) == str(split(host_port)[1])


def ensure(host_port: str, address: str, allow_remote: bool) -> None:
    """In a task process, before TensorFlow starts its server: be the process that listens on `address` only.

    A task started by hand (not by --local-cluster, which sets its tasks up)
    runs its command again with the shim preloaded; this does not return then.
    Without a C compiler, --allow-remote lets the server listen on every interface.
    """
    if is_set_up(host_port, address):
        return
    try:
        env = task_env(host_port, address)
    except ConfigError:
        if not allow_remote:
            raise
        print(
            f"warning: {host_port}: no C compiler to build the bind shim; listening on every interface", file=sys.stderr
        )
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def check_free(name: str, host_port: str, address: str) -> None:
    """FeedbenchError, before TensorFlow starts its server, if the task's port is taken on its address."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, split(host_port)[1]))
        except OSError as e:
            raise FeedbenchError(f"{name}: cannot listen on {host_port}: {e.strerror.lower()}") from None


def listening(port: int) -> list[str]:
    """The local addresses with a socket listening on `port`, from the kernel's tables ([] where there are none)."""
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, _, p = fields[1].partition(":")
            if fields[3] == "0A" and int(p, 16) == port:
                raw = bytes.fromhex(addr)
                words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]  # each 32-bit word is little-endian
                found.append(socket.inet_ntop(family, b"".join(words)))
    return found


def check_listening(name: str, host_port: str, allow_remote: bool) -> None:
    """After the server started: FeedbenchError if it listens beyond loopback without --allow-remote."""
    if allow_remote:
        return
    wide = [a for a in listening(split(host_port)[1]) if not is_loopback(a)]
    if wide:
        raise FeedbenchError(
            f"{name}: the server listens on {', '.join(wide)} port {split(host_port)[1]}, not only on "
            f"{host_port}; stopping (pass --allow-remote to accept that)"
        )
