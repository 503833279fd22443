"""Checking ZMQ endpoints before a socket touches them.

A wrong endpoint should cost the user one clear line naming it, not a
ZMQError from deep inside a worker process. The stream is unauthenticated,
so listening anywhere but this machine must be asked for explicitly.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import sys

import zmq

SCHEMES = ("ipc", "tcp", "inproc")
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
    try:
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
    except zmq.ZMQError as e:
        verb = "bind" if bind else "connect"
        why = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise EndpointError(f"endpoint {endpoint!r}: cannot {verb}: {why}") from None


def free_tcp_port() -> int:
    """A TCP port on loopback that is free right now (for tests and local runs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
