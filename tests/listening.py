"""Which addresses listen on a TCP port, read from the kernel (/proc/net/tcp and tcp6), as `ss -ltn` shows them."""

from __future__ import annotations

import ipaddress
import socket
import struct
import subprocess
import time


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    words = struct.unpack(">4I", raw)
    return socket.inet_ntop(socket.AF_INET6, b"".join(struct.pack("<I", w) for w in words))


def listening(port: int) -> list[str]:
    """Every local address with a socket listening on `port` ("0.0.0.0", "::", "127.0.0.1", "::ffff:127.0.0.1")."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            addr, _, p = local.partition(":")
            if state == "0A" and int(p, 16) == port:
                found.append(_address(addr))
    return found


def only_loopback(addresses: list[str]) -> bool:
    """True when every address is loopback (an IPv4-mapped 127.x counts)."""
    for a in addresses:
        ip = ipaddress.ip_address(a)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if not ip.is_loopback:
            return False
    return bool(addresses)


def wait_listening(p: subprocess.Popen, port: int, timeout: float = 180) -> list[str]:
    """The addresses listening on `port` once something does; fails if `p` exits first or nothing comes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = listening(port)
        if found:
            return found
        if p.poll() is not None:
            raise AssertionError(f"exited with {p.returncode} before listening on {port}: {p.stderr.read()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port} after {timeout} s")
