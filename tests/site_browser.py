"""The tests' browser: a published site served in a background thread, and a page of it rendered in headless
Chromium with every host but loopback unreachable, to prove that the site works with no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from pitfalls import processes
from pitfalls.site.server import DEFAULT_IDLE_TIMEOUT_S, make_server, url_of

CHROMIUM_NAMES = ("chromium", "chromium-browser")

# Headless, no sandbox (we run as root in containers), and none of the background traffic Chromium starts on
# its own (component updates, sync, field trials): without these it tries many outside connections.
BASE_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")

# Every name resolves to nothing and every connection goes through a proxy that is not there (port 9, discard),
# except loopback, which Chromium never proxies: a CDN fetch cannot succeed, not even by accident.
OFFLINE_FLAGS = ("--proxy-server=127.0.0.1:9",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost")
# The viewport; the virtual time a page gets to run its scripts and XHRs before its DOM is taken; and the
# wall-clock limit past which Chromium is killed with its child processes.
WINDOW_SIZE = "1280,900"
BUDGET_MS = 10_000
TIMEOUT_S = 120.0


def find_chromium() -> str | None:
    """Return the path of a Chromium executable on PATH, or None."""
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


def render_page(url: str, screenshot_path: str | os.PathLike[str] | None = None) -> str:
    """Load ``url`` in headless Chromium, every host but loopback blocked, let its scripts run, return the DOM.

    Args:
        url: an http(s) or file URL; hash routes (``index.html#summarylist``) are kept.
        screenshot_path: where to write a PNG of the page, or None.

    Returns:
        The page's DOM as HTML text, after its scripts ran.

    Raises:
        FileNotFoundError: no Chromium on PATH (Debian package ``chromium``).
        RuntimeError: Chromium failed or timed out.
    """
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https", "file"):
        raise ValueError(f"url={url!r} is not allowed; pass an http://, https:// or file:// URL")
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("no chromium on PATH; install the Debian package `chromium` "
                                "(apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="pitfalls-chromium-") as profile:
        command = [chromium, *BASE_FLAGS, *OFFLINE_FLAGS, f"--window-size={WINDOW_SIZE}",
                   f"--user-data-dir={profile}", f"--virtual-time-budget={BUDGET_MS}", "--dump-dom"]
        if screenshot_path is not None:
            target = Path(screenshot_path).resolve()
            target.parent.mkdir(parents=True, exist_ok=True)
            command.append(f"--screenshot={target}")
        command.append(url)
        # Its group holds Chromium's helper processes: a timeout ends them too.
        try:
            done = processes.run(command, timeout_s=TIMEOUT_S, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"chromium did not finish rendering {url} within {TIMEOUT_S} s") from None
    if done.returncode != 0 or not done.stdout.strip():
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"chromium exited with code {done.returncode} rendering {url}:\n{tail}")
    return done.stdout


@contextmanager
def serving(html_dir: str | os.PathLike[str], idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S) -> Iterator[str]:
    """Serve ``html_dir`` on a free loopback port in a background thread for the duration of a ``with`` block.

    Args:
        html_dir, idle_timeout_s: as `make_server`'s.

    Yields:
        The site's URL, e.g. ``"http://127.0.0.1:43817/"``.
    """
    server = make_server(html_dir, idle_timeout_s=idle_timeout_s)
    thread = threading.Thread(target=server.serve_forever, name="pitfalls-site", daemon=True)
    thread.start()
    try:
        yield url_of(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
