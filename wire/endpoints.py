"""Checking ZMQ endpoints before a socket touches them.

A wrong endpoint should cost the user one clear line naming it, not a
ZMQError from deep inside a worker process. The stream is unauthenticated,
so listening anywhere but this machine must be asked for explicitly.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import random
import socket
import stat
import sys
import time

import zmq

from wire import shm

SCHEMES = ("ipc", "tcp", "inproc", "shm")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")


class EndpointError(ValueError):
    """An endpoint that cannot be used; the message names it and says why."""


def _is_loopback(host: str) -> bool:
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split(endpoint: str) -> tuple[str, str]:
    """(scheme, address) of an endpoint, or an EndpointError."""
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise EndpointError(f"endpoint {endpoint!r}: expected SCHEME://ADDRESS with scheme {', '.join(SCHEMES)}")
    scheme, addr = endpoint.split("://", 1)
    if scheme not in SCHEMES:
        raise EndpointError(f"endpoint {endpoint!r}: unknown scheme {scheme!r} (use {', '.join(SCHEMES)})")
    if not addr:
        raise EndpointError(f"endpoint {endpoint!r}: empty address")
    return scheme, addr


def check(endpoint: str, bind: bool, allow_remote: bool = False, secured: bool = False) -> str:
    """Validate an endpoint for binding or connecting; returns it unchanged.

    Binding a TCP endpoint on anything but loopback needs `allow_remote`,
    and then prints a warning, because nothing on the stream is authenticated,
    unless the socket is `secured` with CURVE keys (wire/curve.py).
    """
    scheme, addr = split(endpoint)
    if scheme == "ipc":
        check_ipc(endpoint, addr, bind)
    if scheme == "tcp":
        host, sep, port = addr.rpartition(":")
        if not sep or not host:
            raise EndpointError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT")
        if port != "*":
            if not port.isdigit() or not 0 < int(port) < 65536:
                raise EndpointError(f"endpoint {endpoint!r}: port {port!r} is not a number in 1..65535")
        if bind and not secured and not _is_loopback(host):
            if not allow_remote:
                raise EndpointError(
                    f"endpoint {endpoint!r}: binding to a non-loopback address exposes an "
                    "unauthenticated stream; pass --allow-remote to do it anyway"
                )
            print(
                f"warning: {endpoint} listens beyond this machine; the stream is not authenticated",
                file=sys.stderr,
            )
    elif scheme == "shm":
        try:
            shm.check_name(endpoint)
        except shm.ShmError as e:
            raise EndpointError(str(e)) from None
        if bind and shm.served(endpoint):  # one consumer per NAME, as ipc has it
            raise EndpointError(f"endpoint {endpoint!r}: cannot bind: address already in use")
    elif scheme == "ipc" and bind:
        path = addr
        parent = os.path.dirname(os.path.abspath(path)) or "."
        if not os.path.isdir(parent):
            raise EndpointError(f"endpoint {endpoint!r}: folder {parent!r} does not exist")
        if not os.access(parent, os.W_OK):
            raise EndpointError(f"endpoint {endpoint!r}: folder {parent!r} is not writable")
    return endpoint


def attach(sock: zmq.Socket, endpoint: str, bind: bool, allow_remote: bool = False, secured: bool = False) -> None:
    """Bind or connect `sock`, turning ZMQ's errors into ones that name the endpoint."""
    check(endpoint, bind, allow_remote, secured)
    address = endpoint
    if shm.is_shm(endpoint):  # slot messages travel over an ipc socket in a private folder
        try:
            address = shm.zmq_endpoint(endpoint)
        except shm.ShmError as e:
            raise EndpointError(str(e)) from None
    try:
        if bind:
            sock.bind(address)
        else:
            sock.connect(address)
    except zmq.ZMQError as e:
        verb = "bind" if bind else "connect"
        why = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise EndpointError(f"endpoint {endpoint!r}: cannot {verb}: {why}") from None


# sizeof(sockaddr_un.sun_path) on Linux, less the terminating NUL.
IPC_PATH_MAX = 107


def check_ipc(endpoint: str, path: str, bind: bool) -> None:
    """An ipc path the OS can hold, and, for binding, one no live socket serves.

    ZMQ would silently unlink a live socket's file and bind over it, and the
    run already listening there would wait for batches that never come; a
    path longer than sun_path fails deep inside ZMQ instead of naming itself.
    """
    size = len(os.fsencode(path))
    if size > IPC_PATH_MAX:
        raise EndpointError(
            f"endpoint {endpoint!r}: the socket path is {size} bytes, longer than the {IPC_PATH_MAX} the OS allows"
        )
    if bind and not path.startswith("@") and ipc_served(path):
        raise EndpointError(f"endpoint {endpoint!r}: cannot bind: address already in use")


def ipc_served(path: str) -> bool:
    """True when a live socket accepts connections at `path` (a stale socket file refuses them)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise EndpointError(f"endpoint 'ipc://{path}': {path!r} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def release(endpoint: str, bind: bool) -> None:
    """Remove the socket file of an ipc or shm endpoint this process bound (ZMQ leaves it behind)."""
    scheme, path = split(endpoint)
    if not bind or scheme != "ipc" or path.startswith("@"):
        return
    try:
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass


def listening(endpoint: str) -> bool:
    """True while a socket still listens at a tcp:// or shm:// endpoint this process bound and closed.

    ZMQ closes a socket in its I/O thread, after `close` returns: until then
    the next bind of the same address (the next path of a run) is refused.
    """
    scheme, addr = split(endpoint)
    if scheme == "shm":
        return shm.served(endpoint)
    if scheme != "tcp" or ":" not in addr:
        return False
    host, port = addr.rsplit(":", 1)
    host = {"*": "0.0.0.0"}.get(host, host.strip("[]"))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZMQ binds: a TIME_WAIT port is free
        try:
            s.bind((host, int(port)))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
        except ValueError:
            return False
    return False


def wait_released(endpoint: str, seconds: float = 2.0) -> None:
    """Return once a closed socket no longer listens at `endpoint` (or after `seconds`)."""
    deadline = time.monotonic() + seconds
    while listening(endpoint) and time.monotonic() < deadline:
        time.sleep(0.005)


def check_reachable(endpoint: str) -> str:
    """Refuse an endpoint another process cannot reach (inproc://), for producers and their consumers."""
    if split(endpoint)[0] == "inproc":
        raise EndpointError(
            f"endpoint {endpoint!r}: inproc:// reaches only sockets inside one process, "
            "and producers run in their own; use ipc:// or tcp://"
        )
    return endpoint


EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_tcp_port() -> int:
    """A TCP port on loopback that is free right now (for tests and local runs).

    Taken below the kernel's ephemeral range where there is room: a port from that range may be given to
    any outgoing connection (another process's client socket) before this one is bound, and the bind
    then fails with "address already in use".
    """
    try:
        with open(EPHEMERAL_RANGE) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for port in random.sample(range(10_000, low), min(64, max(0, low - 10_000))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the range: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
