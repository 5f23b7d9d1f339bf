"""Serve a published site over HTTP on the loopback interface only.

What it serves and refuses, and why (``asv preview``'s faults, DNS rebinding): docs/asv.md, "Publishing and viewing
offline". ``python -m pitfalls.site.server [HTML_DIR] [--port N] [--host 127.0.0.1] [--idle-timeout S]``
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import socket
import stat
import sys
import urllib.parse
from collections.abc import Iterable
from contextlib import suppress
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, cast

DEFAULT_HOST = "127.0.0.1"
# Seconds a connection may stay silent (mid-request or while not reading the answer) before it is closed.
DEFAULT_IDLE_TIMEOUT_S = 10.0
# The site's page loads fetch dozens of files at once; the stdlib's default backlog of 5 drops connections then.
LISTEN_BACKLOG = 128


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
        raise ValueError(f"host={host!r} is not allowed: the site is served on loopback only (127.0.0.1, another "
                         "127.x.y.z, ::1 or 'localhost'); to reach it from elsewhere, use an SSH tunnel "
                         "(ssh -L PORT:127.0.0.1:PORT)")
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
        raise ValueError(f"html_dir={str(path)!r} has no index.html; pass the folder `asv publish` wrote "
                         "(then localized by scripts/publish)")
    return path


def _check_idle_timeout(seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise ValueError(f"idle_timeout_s={seconds!r} is not allowed; use a number of seconds > 0")
    return float(seconds)


def allowed_hosts(server_address: tuple[Any, ...]) -> frozenset[str]:
    """Return the ``Host`` header values a server bound at ``server_address`` answers (lower case).

    Args:
        server_address: the bound ``(host, port, ...)``.

    Returns:
        The bound address and ``localhost``, each with the port (and without it too on port 80, where browsers
        leave it out).
    """
    host, port = str(server_address[0]), int(server_address[1])
    names = {f"[{host}]" if ":" in host else host, "localhost"}
    values = {f"{name}:{port}" for name in names}
    if port == 80:
        values |= names
    return frozenset(values)


class _SiteHandler(SimpleHTTPRequestHandler):
    """Serves the site's regular files to requests addressed to this server, without a log line per request."""

    def __init__(self, *args: Any, directory: str, idle_timeout_s: float, **kwargs: Any) -> None:
        self._idle_timeout_s = idle_timeout_s  # before the base __init__, which handles the whole request
        super().__init__(*args, directory=directory, **kwargs)

    def setup(self) -> None:
        super().setup()
        # Every recv and send waits at most this long: a silent client is dropped, not waited on forever.
        self.connection.settimeout(self._idle_timeout_s)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        host = self.headers.get("Host")
        allowed = allowed_hosts(cast(tuple[Any, ...], self.server.server_address))
        if host is None or host.strip().lower() not in allowed:
            self.send_error(HTTPStatus.FORBIDDEN, "Host not allowed",
                            f"this server answers only Host {', '.join(sorted(allowed))}, not {host!r}")
            return False
        return True

    def _site_file(self) -> Path | str | None:
        """The resolved regular file the request names; a redirect target (str) for a folder without its '/'."""
        root = Path(self.directory).resolve()
        wanted = Path(self.translate_path(self.path))  # unquoted, query and '..' dropped, under the folder
        try:
            real = wanted.resolve()
            if real.is_dir() and real.is_relative_to(root):
                parts = urllib.parse.urlsplit(self.path)
                real = (real / "index.html").resolve()
                if real.is_relative_to(root) and real.is_file() and not parts.path.endswith("/"):
                    # What Apache does: the folder's relative links need the trailing slash.
                    return urllib.parse.urlunsplit(parts._replace(path=parts.path + "/"))
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
            return None
        return real if real.is_relative_to(root) and real.is_file() else None

    def send_head(self) -> IO[bytes] | None:  # type: ignore[override]
        found = self._site_file()
        if isinstance(found, str):
            self.send_response(HTTPStatus.MOVED_PERMANENTLY)
            self.send_header("Location", found)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if found is None:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        # O_NOFOLLOW and the fstat check close the gap between the checks above and the open: a file swapped
        # for a symlink or a FIFO meanwhile is refused, not followed or waited on.
        try:
            fd = os.open(found, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        file = os.fdopen(fd, "rb")
        try:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                file.close()
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-type", self.guess_type(found))
            self.send_header("Content-Length", str(status.st_size))
            self.send_header("Last-Modified", self.date_time_string(int(status.st_mtime)))
            self.end_headers()
        except BaseException:
            file.close()
            raise
        return file


class _SiteServer(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A browser that navigates away, or a client that hangs up or goes quiet, ends its connection
        # mid-answer: that is their right, not a server error worth a traceback on stderr.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _V6SiteServer(_SiteServer):
    address_family = socket.AF_INET6


def make_server(html_dir: str | os.PathLike[str], port: int = 0, host: str = DEFAULT_HOST,
                idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S) -> ThreadingHTTPServer:
    """Bind (without starting) an HTTP server for ``html_dir`` on a loopback address.

    Args:
        html_dir: the site folder (holds index.html).
        port: the TCP port; 0 picks a free one.
        host: a loopback address; anything else is refused.
        idle_timeout_s: seconds a connection may send or read nothing before it is closed (> 0).

    Returns:
        The bound server; ``server.server_address`` holds the address and the port chosen.
    """
    site = _check_site(html_dir)
    address = check_loopback(host)
    port = _check_port(port)
    # A path string, not a chdir: each request resolves it anew, so a folder replaced by `asv publish` works.
    handler = functools.partial(_SiteHandler, directory=str(site), idle_timeout_s=_check_idle_timeout(idle_timeout_s))
    server_class = _V6SiteServer if ":" in address else _SiteServer
    return server_class((address, port), handler)


def url_of(server: ThreadingHTTPServer) -> str:
    """Return the ``http://host:port/`` address a bound server answers on."""
    host, port = server.server_address[:2]
    host = host.decode("ascii") if isinstance(host, bytes) else str(host)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def main(argv: Iterable[str] | None = None) -> int:
    """Command line: serve a published site on loopback until interrupted (Ctrl-C), printing the URL first."""
    parser = argparse.ArgumentParser(prog="python -m pitfalls.site.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", nargs="?", default="html", help="the site folder (default: html)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port; 0 picks a free one (default: 8080)")
    parser.add_argument("--host", default=DEFAULT_HOST, help="loopback address to bind (default: 127.0.0.1)")
    parser.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                        help=f"close a connection silent this long (default: {DEFAULT_IDLE_TIMEOUT_S:g})")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        server = make_server(args.html_dir, port=args.port, host=args.host, idle_timeout_s=args.idle_timeout)
    except (TypeError, ValueError) as error:
        parser.error(str(error))
    except OSError as error:
        parser.error(f"cannot listen on {args.host}:{args.port}: {error.strerror}; --port 0 picks a free port")
    print(f"serving {Path(args.html_dir).resolve()} at {url_of(server)} (loopback only; Ctrl-C stops)", flush=True)
    with server, suppress(KeyboardInterrupt):  # leaving the server's block closes it
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
