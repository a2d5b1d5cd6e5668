"""``serve``'s readiness probe against what may answer on its port (real sockets on 127.0.0.1, no Ray).

A full-suite run once ended ``serve`` with exit 4 ``internal error: BadStatusLine: \\x00\\x00\\x18\\x04...``: the port
the test picked free was taken, while the embedded Ray started, by one of Ray's own gRPC servers (HTTP/2 frames),
and the probe let the HTTP client's exception out. Something that answers but not in HTTP/1.1 is now one
ConfigError line naming the port; a port nothing listens on yet stays "not ready" (the probe polls again).
"""

from __future__ import annotations

import socket
import threading

import pytest

from distributed_onnx.errors import ConfigError

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.integration

from distributed_onnx.serve.runner import answers_ready  # noqa: E402 (needs Serve)

#: The first bytes an HTTP/2 (gRPC) server sends: a SETTINGS frame, what the probe met in that run.
HTTP2_SETTINGS = b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04\x00\x40\x00\x00\x00\x05\x00\x40\x00\x00\x00\x06\x00\x00"


def _serve_bytes_once(reply: bytes) -> tuple[int, threading.Thread]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = int(listener.getsockname()[1])

    def answer() -> None:
        with listener:
            connection, _ = listener.accept()
            with connection:
                connection.recv(4096)
                connection.sendall(reply)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return port, thread


def test_a_port_answered_by_something_else_is_one_config_error_naming_it() -> None:
    port, thread = _serve_bytes_once(HTTP2_SETTINGS)
    with pytest.raises(ConfigError) as raised:
        answers_ready("127.0.0.1", port)
    thread.join(timeout=5)
    message = str(raised.value)
    assert f"127.0.0.1:{port} answers, but not as Serve's HTTP proxy" in message
    assert "--port" in message and "\n" not in message


def test_a_port_nothing_listens_on_is_not_ready_yet_and_a_200_is_ready() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = int(closed.getsockname()[1])
    assert answers_ready("127.0.0.1", port) is False
    port, thread = _serve_bytes_once(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    assert answers_ready("127.0.0.1", port) is True
    thread.join(timeout=5)
