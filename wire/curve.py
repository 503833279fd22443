"""Optional CURVE encryption and authentication, for streams that leave the machine.

The side that binds is the CURVE server and accepts only clients whose
public key is in the key folder; the side that connects is a client. One
folder holds both key pairs: copy it to every host of the stream.

    python -m producers make-keys keys/
    python -m producers synthetic --endpoint tcp://HOST:5555 --curve-keys keys/
"""

from __future__ import annotations

import os
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator


class CurveError(ValueError):
    """A key folder that cannot be used; the message names it."""


def available() -> bool:
    return zmq.has("curve")


def make_keys(folder: str | os.PathLike) -> Path:
    """Create server and client key pairs in `folder` (kept if already there)."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    for name in ("server", "client"):
        if not (d / f"{name}.key_secret").exists():
            zmq.auth.create_certificates(d, name)
        os.chmod(d / f"{name}.key_secret", 0o600)
    return d


def _load(folder: Path, name: str, secret: bool) -> tuple[bytes, bytes | None]:
    path = folder / (f"{name}.key_secret" if secret else f"{name}.key")
    if not path.exists():
        raise CurveError(
            f"--curve-keys {folder}: {path.name} is missing (make the keys with `python -m producers make-keys {folder}`)"
        )
    try:
        return zmq.auth.load_certificate(path)
    except Exception as e:
        raise CurveError(f"--curve-keys {folder}: {path.name} is not a valid key file ({e})") from None


def check_folder(folder: str | os.PathLike, server: bool | None = None) -> None:
    """Refuse, before anything starts, a key folder that lacks a key this side needs (CurveError).

    `server`: True for the binding side, False for a connecting one, None for
    a run that is both (its consumer binds, its own producers connect).
    """
    d = Path(folder)
    if not d.is_dir():
        raise CurveError(
            f"--curve-keys {folder}: no such folder (make the keys with `python -m producers make-keys {folder}`)"
        )
    if server is not False:
        _load(d, "server", True)
    if server is not True:
        _load(d, "client", True)
        _load(d, "server", False)


def secure(sock: zmq.Socket, folder: str | os.PathLike, server: bool) -> ThreadAuthenticator | None:
    """Set `sock` up as CURVE server (binding side) or client; call before bind/connect.

    The server also starts an authenticator that admits only the folder's
    client keys; the caller stops it (`.stop()`) when the socket is closed.
    """
    if not available():
        raise CurveError("CURVE needs libzmq built with libsodium; this one is not")
    d = Path(folder)
    if server:
        public, secret = _load(d, "server", True)
        auth = ThreadAuthenticator(sock.context)
        auth.start()
        auth.configure_curve(domain="*", location=str(d))
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True
        return auth
    public, secret = _load(d, "client", True)
    server_public, _ = _load(d, "server", False)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public
    return None
