"""A TCP relay on the loopback for tests that need to see or shape a link.

Each connection accepted on `Relay.port` is joined to a new connection to
`target`, and bytes flow both ways through `Relay.pass_on`, which sends them
on unchanged; a subclass overrides it to count, record or delay them
(`opened` gives it per-connection state). A relay stops accepting when it
is closed; the connections it joined end when either side closes.
"""

from __future__ import annotations

import socket
import threading
from typing import Any


class Relay:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0), backlog=16)
        self.port: int = self.server.getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Relay":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def close(self) -> None:
        self.server.close()

    def opened(self) -> Any:
        """State for one joined connection, handed to `pass_on` in both directions."""
        return None

    def pass_on(self, state: Any, upstream: bool, data: bytes, dst: socket.socket) -> None:
        """Sends `data`, read from one side (`upstream`: from the accepted
        connection towards `target`), to the other."""
        dst.sendall(data)

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.server.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.target, timeout=5)
                up.settimeout(None)
            except OSError:
                down.close()
                continue
            state = self.opened()
            threading.Thread(target=self._pump, args=(down, up, True, state), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, False, state), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool, state: Any) -> None:
        try:
            while data := src.recv(65536):
                self.pass_on(state, upstream, data, dst)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
