"""A W&B server on 127.0.0.1 that an online `wandb` client (0.31, wandb-core) can log a run to, and that
can go away in the middle of the run.

It answers what the client was seen to ask for a run with a fixed id: the GraphQL documents
RunResumeStatus, UpsertBucket (creates the run, twice), ServerFeaturesQuery,
OrganizationCoreWeaveOrganizationID and CreateRunFiles (with upload URLs back to this server),
the PUTs of those files, POSTs to /files/<entity>/<project>/<run>/file_stream, and the client's own
telemetry (/sdk/otel/...). Any other document gets `{"data": {}}`, and is recorded like everything
else, so a test sees when a new client version asks for more.

`drop()` makes the server vanish the way a lost network looks to the client: the listening socket is
closed (new connections are refused) and every open connection is cut, so requests already on a
kept-alive connection fail too.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

ENTITY = "tester"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    operation: str  # the GraphQL document's name; "" for other requests
    body: bytes
    headers: dict[str, str]


def _operation(document: str) -> str:
    match = re.search(r"\b(?:query|mutation)\s+(\w+)", document)
    return match.group(1) if match else "?"


def _graphql_data(operation: str, variables: dict[str, Any], base_url: str) -> dict[str, Any]:
    """The `data` of a GraphQL answer: just the fields the client reads."""
    if operation == "UpsertBucket":
        return {"upsertBucket": {"inserted": True, "bucket": {
            "id": "UnVuOjE=", "name": variables.get("name"), "displayName": variables.get("displayName"),
            "description": None, "config": "{}", "sweepName": None, "historyLineCount": 0,
            "project": {"id": "UHJvamVjdDox", "name": variables.get("project") or "uncategorized",
                        "entity": {"id": "RW50aXR5OjE=", "name": variables.get("entity") or ENTITY}}}}}
    if operation == "ServerFeaturesQuery":
        return {"serverInfo": {"features": []}}
    if operation == "OrganizationCoreWeaveOrganizationID":
        return {"entity": {"organization": None}}
    if operation == "CreateRunFiles":
        # wandb-core 0.31 dereferences every file's upload URL: leaving them out makes it panic.
        return {"createRunFiles": {"runID": "UnVuOjE=", "uploadHeaders": [], "files": [
            {"name": name, "uploadUrl": f"{base_url}/upload/{name}"} for name in variables.get("files", [])]}}
    return {}  # RunResumeStatus: no such run yet, so the run is created


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real server: the drop must cut open connections
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.opened(self.connection)

    def finish(self) -> None:
        self.server.closed(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # every request is recorded instead

    def do_GET(self) -> None:
        self._answer("GET", lambda body: {})

    def do_PUT(self) -> None:
        self._answer("PUT", lambda body: {})

    def do_POST(self) -> None:
        if self.path.startswith("/graphql"):
            self._answer("POST", self._graphql)
        elif self.path.endswith("/file_stream"):
            self._answer("POST", lambda body: {"exitcode": None, "limits": {}})
        else:
            self._answer("POST", lambda body: {})

    def _graphql(self, body: bytes) -> dict[str, Any]:
        request = json.loads(body)
        data = _graphql_data(_operation(request.get("query", "")), request.get("variables") or {},
                             self.server.base_url)
        return {"data": data}

    def _answer(self, method: str, answer: Callable[[bytes], dict[str, Any]]) -> None:
        if self.server.gone.is_set():  # a request that slipped in while dropping: no answer
            self.close_connection = True
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        operation = _operation(json.loads(body).get("query", "")) if self.path.startswith("/graphql") else ""
        data = json.dumps(answer(body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()
        # Recorded after the answer is sent, so a test that drops the server on seeing a request
        # drops it after the client got its answer.
        self.server.record(Request(method, self.path, operation, body, dict(self.headers.items())))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, on_request: Callable[[Request], None]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.base_url = f"http://127.0.0.1:{self.server_address[1]}"
        self.gone = threading.Event()
        self.requests: list[Request] = []
        self._on_request = on_request
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    def opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)
        self._on_request(request)

    def cut_connections(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a connection reset by the client or cut by drop(): expected, not the test's subject
        super().handle_error(request, client_address)  # a bug here: shown, not hidden


class FakeWandbServer:
    """Serves in a thread from start() until drop() or stop()."""

    def __init__(self, drop_when: Callable[[Request], bool] = lambda request: False) -> None:
        self._drop_when = drop_when
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._dropping = threading.Lock()  # two requests may ask for the drop at once

    @property
    def base_url(self) -> str:
        assert self._server is not None, "not started"
        return self._server.base_url

    @property
    def gone(self) -> bool:
        return self._server is not None and self._server.gone.is_set()

    @property
    def requests(self) -> list[Request]:
        return list(self._server.requests) if self._server is not None else []

    def start(self) -> FakeWandbServer:
        self._server = _Server(self._on_request)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-wandb-server", daemon=True)
        self._thread.start()
        return self

    def _on_request(self, request: Request) -> None:
        # In the handler's thread (serve_forever runs in another, so shutdown() cannot wait on itself),
        # before the client can send anything more on this connection.
        if self._drop_when(request):
            self.drop()

    def drop(self) -> None:
        server = self._server
        with self._dropping:
            if server is None or server.gone.is_set():
                return
            server.gone.set()
        server.shutdown()  # stops accepting
        server.server_close()  # closes the listening socket: new connections are refused
        server.cut_connections()

    def stop(self) -> None:
        self.drop()
        if self._thread is not None:
            self._thread.join(timeout=5)
