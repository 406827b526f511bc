"""The serving address is checked before any model loads: a busy port or a host that is not this
machine's is one line at once, not seven lines after minutes of loading.

The check binds the address as uvicorn will (``SO_REUSEADDR``, every address ``host`` resolves
to) and closes it again; a server that takes the port in between is told by uvicorn itself.
"""

from __future__ import annotations

import errno
import socket

from dflash_trt.errors import DFlashError


def check_free(host: str, port: int) -> None:
    """Raise one line when ``host:port`` cannot be listened on now; return when it can."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise DFlashError(f"--host {host}: cannot resolve it ({getattr(exc, 'strerror', None) or exc})") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise DFlashError(
                        f"--port {port}: {host}:{port} is already in use; stop what listens there "
                        "or pass another --port"
                    ) from None
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise DFlashError(f"--host {host}: not an address of this machine") from None
                if exc.errno == errno.EACCES:
                    raise DFlashError(f"--port {port}: binding it needs privileges; pass a port above 1023") from None
                raise DFlashError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None
