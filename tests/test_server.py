"""The loopback site server under hostile and careless clients, spoken to over raw sockets on 127.0.0.1 only."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from site_browser import serving

from pitfalls.site.server import allowed_hosts, main, make_server

IDLE_S = 1.0  # the idle timeout the tests give the server: short, so a closed connection shows quickly
GUARD_S = 10.0  # how long a test waits for an answer before it calls the server stuck (a guard, not a timing)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site folder with a page, a sub-folder with its own page, and a folder without one."""
    root = tmp_path / "html"
    (root / "graphs").mkdir(parents=True)
    (root / "index.html").write_text("the index")
    (root / "index.json").write_text('{"ok": true}')
    (root / "graphs" / "index.html").write_text("the graphs")
    (root / "data").mkdir()
    (root / "data" / "results.json").write_text("[]")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the site, standing for /etc: nothing in it may be served."""
    folder = tmp_path / "secret"
    folder.mkdir()
    (folder / "shadow").write_text("root:$6$not-for-the-browser")
    return folder


@pytest.fixture
def port(site: Path) -> Iterator[int]:
    with serving(site, idle_timeout_s=IDLE_S) as url:
        yield int(url.rsplit(":", 1)[1].strip("/"))


def exchange(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes to the server and read the whole answer (it closes after one, HTTP/1.0)."""
    with socket.create_connection(("127.0.0.1", port), timeout=GUARD_S) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines)}
    return int(status_line.split()[1]), headers, body


def get(port: int, path: str, host: str | None = "127.0.0.1:{port}") -> tuple[int, dict[str, str], bytes]:
    lines = [f"GET {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host.format(port=port)}")
    return exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def handler_threads() -> list[threading.Thread]:
    """The server's threads, one per open connection (every server in this process is a site server)."""
    return [t for t in threading.enumerate() if "process_request_thread" in t.name]


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {GUARD_S} s for {what}")
        time.sleep(0.02)


# --- only regular files inside the site ---------------------------------------------------------------------


def test_site_files_are_served(port: int) -> None:
    status, headers, body = get(port, "/index.json?t=1")
    assert (status, body) == (200, b'{"ok": true}')
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(body))


def test_a_symlinked_folder_that_leaves_the_site_is_not_followed(site: Path, outside: Path, port: int) -> None:
    (site / "link").symlink_to(outside)  # html/link -> /etc
    status, _, body = get(port, "/link/shadow")
    assert status == 404
    assert b"root:" not in body


def test_a_symlinked_file_that_leaves_the_site_is_not_followed(site: Path, outside: Path, port: int) -> None:
    (site / "shadow.json").symlink_to(outside / "shadow")
    assert get(port, "/shadow.json")[0] == 404
    # index.html of a folder is looked up through symlinks too
    (site / "graphs" / "index.html").unlink()
    (site / "graphs" / "index.html").symlink_to(outside / "shadow")
    assert get(port, "/graphs/")[0] == 404


def test_a_symlink_that_stays_inside_the_site_is_served(site: Path, port: int) -> None:
    (site / "latest.json").symlink_to(site / "data" / "results.json")
    assert get(port, "/latest.json")[:3:2] == (200, b"[]")


def test_traversal_and_a_symlink_loop_are_404(site: Path, port: int) -> None:
    (site / "loop").symlink_to(site / "loop")
    assert get(port, "/../secret/shadow")[0] == 404
    assert get(port, "/%2e%2e/secret/shadow")[0] == 404
    assert get(port, "/loop")[0] == 404


def test_a_fifo_in_the_site_is_404_not_a_hang(site: Path, port: int) -> None:
    os.mkfifo(site / "pipe.json")  # opening it for reading would wait for a writer forever
    assert get(port, "/pipe.json")[0] == 404


# --- no directory listings ------------------------------------------------------------------------------------


def test_a_folder_without_index_html_is_404_not_a_listing(port: int) -> None:
    status, _, body = get(port, "/data/")
    assert status == 404
    assert b"results.json" not in body
    assert get(port, "/data")[0] == 404


def test_a_folder_with_index_html_serves_it(port: int) -> None:
    status, headers, _ = get(port, "/graphs")
    assert status == 301 and headers["location"] == "/graphs/"  # so the page's relative links resolve
    assert get(port, "/graphs/")[:3:2] == (200, b"the graphs")
    assert get(port, "/")[:3:2] == (200, b"the index")


# --- the Host header (DNS rebinding) ----------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LocalHost:{port}"])
def test_the_bound_address_and_localhost_are_answered(port: int, host: str) -> None:
    assert get(port, "/", host=host)[:3:2] == (200, b"the index")


@pytest.mark.parametrize(
    "host",
    ["evil.example:{port}", "evil.example", "127.0.0.1", "localhost", "localhost:1", "127.0.0.2:{port}", "", None],
)
def test_any_other_host_is_403(port: int, host: str | None) -> None:
    status, _, body = get(port, "/index.json", host=host)
    assert status == 403
    assert b'"ok"' not in body
    assert f"127.0.0.1:{port}".encode() in body  # the page says which address to use


def test_allowed_hosts_follow_the_bound_address() -> None:
    assert allowed_hosts(("127.0.0.1", 8080)) == {"127.0.0.1:8080", "localhost:8080"}
    assert allowed_hosts(("::1", 8080, 0, 0)) == {"[::1]:8080", "localhost:8080"}
    # browsers leave the default port out of Host
    assert allowed_hosts(("127.0.0.1", 80)) == {"127.0.0.1:80", "localhost:80", "127.0.0.1", "localhost"}


# --- idle connections -------------------------------------------------------------------------------------------


def test_half_sent_requests_are_closed_and_their_threads_end(port: int) -> None:
    wait_until(lambda: not handler_threads(), "earlier connections to end")
    clients = []
    try:
        for _ in range(100):
            conn = socket.create_connection(("127.0.0.1", port), timeout=GUARD_S)
            conn.sendall(b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1")  # never finished
            clients.append(conn)
        for conn in clients:
            # The server closes each one: recv sees the end of the stream (before: it waited forever).
            assert conn.recv(65536) == b""
    finally:
        for conn in clients:
            conn.close()
    wait_until(lambda: not handler_threads(), "the handler threads to end")
    assert get(port, "/")[0] == 200


def test_a_client_that_does_not_read_does_not_hold_a_thread(site: Path, port: int) -> None:
    (site / "big.bin").write_bytes(os.urandom(16 * 1024 * 1024))  # far more than the socket buffers hold
    wait_until(lambda: not handler_threads(), "earlier connections to end")
    with socket.socket() as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting, so the window stays small
        conn.settimeout(GUARD_S)
        conn.connect(("127.0.0.1", port))
        conn.sendall(f"GET /big.bin HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        wait_until(handler_threads, "the server to start answering")
        wait_until(lambda: not handler_threads(), "the stalled answer to be given up")


@pytest.mark.parametrize("seconds", [0, -1.0, "5", True, float("inf")])
def test_bad_idle_timeouts_are_refused(site: Path, seconds: object) -> None:
    with pytest.raises(ValueError, match=f"idle_timeout_s={seconds!r} is not allowed"):
        make_server(site, idle_timeout_s=seconds)  # type: ignore[arg-type]


def test_the_command_line_refuses_a_bad_idle_timeout(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(site), "--port", "0", "--idle-timeout", "0"])
    assert exit_info.value.code == 2
    assert "idle_timeout_s=0.0 is not allowed" in capsys.readouterr().err


# --- clients that hang up ---------------------------------------------------------------------------------------


def test_clients_that_hang_up_mid_answer_leave_no_traceback(
    site: Path, port: int, capfd: pytest.CaptureFixture[str]
) -> None:
    (site / "big.bin").write_bytes(os.urandom(8 * 1024 * 1024))
    wait_until(lambda: not handler_threads(), "earlier connections to end")
    for _ in range(10):
        conn = socket.create_connection(("127.0.0.1", port), timeout=GUARD_S)
        conn.sendall(f"GET /big.bin HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        assert conn.recv(1024).startswith(b"HTTP/1.0 200")  # the server is writing the file
        # Close with a reset (linger 0), as a browser tab that is closed does: the server's next write fails.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    wait_until(lambda: not handler_threads(), "the handler threads to end")
    err = capfd.readouterr().err
    for word in ("Traceback", "BrokenPipeError", "ConnectionResetError", "Exception occurred"):
        assert word not in err, err
    assert get(port, "/")[0] == 200


# --- the listen backlog -----------------------------------------------------------------------------------------


def test_a_burst_of_connections_is_queued_not_dropped(site: Path) -> None:
    server = make_server(site)  # bound and listening, but not accepting yet: the backlog alone holds them
    port = server.server_address[1]
    clients = []
    try:
        for _ in range(100):
            conn = socket.socket()
            conn.settimeout(2.0)  # a dropped SYN is retried after 1 s, then 3 s: past this, it was dropped
            conn.connect(("127.0.0.1", port))
            clients.append(conn)
        assert len(clients) == 100
    finally:
        for conn in clients:
            conn.close()
        server.server_close()
