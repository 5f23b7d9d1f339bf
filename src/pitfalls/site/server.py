"""Serve a published site over HTTP on the loopback interface only.

The site fetches its JSON by XHR, so opening index.html as a file is not enough. ``asv preview`` listens on every
interface (0.0.0.0) although it prints 127.0.0.1, and it stops serving after each ``asv publish`` because it
serves the folder that publish deletes; this server binds a loopback address only and looks the folder up by
path on every request, so a re-published site is served at once.

``python -m pitfalls.site.server [HTML_DIR] [--port N] [--host 127.0.0.1]``
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import socket
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DEFAULT_HOST = "127.0.0.1"


def check_loopback(host: Any) -> str:
    """Return the loopback IP address to bind for ``host``, refusing anything reachable from other machines.

    Args:
        host: an IP address in 127.0.0.0/8, ``"::1"``, or ``"localhost"`` (taken as 127.0.0.1).

    Returns:
        The address as a string.
    """
    if not isinstance(host, str):
        raise TypeError(f"host must be a str, got {type(host).__name__}")
    if host == "localhost":
        return DEFAULT_HOST
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is None or not address.is_loopback:
        raise ValueError(
            f"host={host!r} is not allowed: the site is served on loopback only "
            "(127.0.0.1, another 127.x.y.z, ::1 or 'localhost'); to reach it from elsewhere, "
            "use an SSH tunnel (ssh -L PORT:127.0.0.1:PORT)"
        )
    return str(address)


def _check_port(port: Any) -> int:
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"port must be an int, got {port!r} ({type(port).__name__})")
    if not 0 <= port <= 65535:
        raise ValueError(f"port={port!r} is not allowed; use 0 (pick a free port) or 1..65535")
    return port


def _check_site(html_dir: Any) -> Path:
    if not isinstance(html_dir, (str, os.PathLike)):
        raise TypeError(f"html_dir must be a path (str or os.PathLike), got {type(html_dir).__name__}")
    path = Path(html_dir).resolve()
    if not (path / "index.html").is_file():
        raise ValueError(
            f"html_dir={str(path)!r} has no index.html; pass the folder `asv publish` wrote "
            "(then localized by scripts/publish)"
        )
    return path


class _QuietHandler(SimpleHTTPRequestHandler):
    """Serves files without logging every request to stderr (the site makes dozens per page)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def make_server(html_dir: str | os.PathLike[str], port: int = 0, host: str = DEFAULT_HOST) -> ThreadingHTTPServer:
    """Bind (without starting) an HTTP server for ``html_dir`` on a loopback address.

    Args:
        html_dir: the site folder (holds index.html).
        port: the TCP port; 0 picks a free one.
        host: a loopback address; anything else is refused.

    Returns:
        The bound server; ``server.server_address`` holds the address and the port chosen.
    """
    site = _check_site(html_dir)
    address = check_loopback(host)
    port = _check_port(port)
    # A path string, not a chdir: each request resolves it anew, so a folder replaced by `asv publish` works.
    handler = functools.partial(_QuietHandler, directory=str(site))
    server_class = _V6Server if ":" in address else ThreadingHTTPServer
    server = server_class((address, port), handler)
    server.daemon_threads = True
    return server


def url_of(server: ThreadingHTTPServer) -> str:
    """Return the ``http://host:port/`` address a bound server answers on."""
    host, port = server.server_address[:2]
    host = host.decode("ascii") if isinstance(host, bytes) else str(host)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


@contextmanager
def serving(html_dir: str | os.PathLike[str], port: int = 0, host: str = DEFAULT_HOST) -> Iterator[str]:
    """Serve ``html_dir`` in a background thread for the duration of a ``with`` block.

    Args:
        html_dir: the site folder.
        port: the TCP port; 0 picks a free one.
        host: a loopback address.

    Yields:
        The site's URL, e.g. ``"http://127.0.0.1:43817/"``.
    """
    server = make_server(html_dir, port=port, host=host)
    thread = threading.Thread(target=server.serve_forever, name="pitfalls-site", daemon=True)
    thread.start()
    try:
        yield url_of(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def serve(html_dir: str | os.PathLike[str], port: int = 0, host: str = DEFAULT_HOST) -> None:
    """Serve ``html_dir`` until interrupted (Ctrl-C), printing the URL first.

    Args:
        html_dir: the site folder.
        port: the TCP port; 0 picks a free one.
        host: a loopback address.
    """
    server = make_server(html_dir, port=port, host=host)
    print(f"serving {Path(html_dir).resolve()} at {url_of(server)} (loopback only; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: Iterable[str] | None = None) -> int:
    """Command line: serve a published site on loopback."""
    parser = argparse.ArgumentParser(prog="python -m pitfalls.site.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", nargs="?", default="html", help="the site folder (default: html)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port; 0 picks a free one (default: 8080)")
    parser.add_argument("--host", default=DEFAULT_HOST, help="loopback address to bind (default: 127.0.0.1)")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        serve(args.html_dir, port=args.port, host=args.host)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    except OSError as error:
        parser.error(f"cannot listen on {args.host}:{args.port}: {error.strerror}; --port 0 picks a free port")
    return 0


if __name__ == "__main__":
    sys.exit(main())
