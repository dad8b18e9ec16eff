"""A W&B server on 127.0.0.1 that an online `wandb` client (0.31, wandb-core) can log a run to, and that
can go away in the middle of the run.

It answers what the client was seen to ask for a run with a fixed id: the GraphQL documents
RunResumeStatus, UpsertBucket (creates the run, twice), ServerFeaturesQuery,
OrganizationCoreWeaveOrganizationID and CreateRunFiles (with upload URLs back to this server),
the PUTs of those files, POSTs to /files/<entity>/<project>/<run>/file_stream, and the client's own
telemetry (/sdk/otel/...).

It also answers what `wandb.Api()` and wandb-workspaces (0.4.13) were seen to send to save a report and
to fetch a group's runs (`python -m analysis.compare --from_wandb`, the W&B report's live path): Viewer,
GetDefaultEntity, GetProjects, CreateProject, ProjectInternalId, upsertView (recorded in `views`), Runs
(the group filter only), RunHistoryKeys, RunParquetHistory (every row as live data) and HistoryPage,
from the `projects` and `runs` a test gives it.

Any other GraphQL document is answered with an error and recorded in `unknown_operations`: a test asserts
that list is empty, so a client that asks for something new fails rather than passing on an empty answer.

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
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ENTITY = "tester"
PROJECT_ID = "UHJvamVjdDox"
PROJECT_INTERNAL_ID = "internal-1"
VIEW_ID = "VmlldzoxMjM0NQ=="


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


@dataclass
class RemoteRun:
    """A run as the server holds it: where it is, and what train.py logged (config, summary, history rows)."""

    entity: str
    project: str
    id: str
    group: str
    config: dict[str, Any]
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    name: str = ""


class UnknownOperation(Exception):
    """A GraphQL document this fake does not implement: answered with an error, and recorded."""


class Refused(Exception):
    """An operation the server refuses (FakeWandbServer.refuse): answered with the error's message."""


def _graphql_data(operation: str, variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    """The `data` of a GraphQL answer: just the fields the client reads."""
    base_url = server.base_url
    if operation in _REPORT_OPERATIONS:
        return _REPORT_OPERATIONS[operation](variables, server)
    if operation == "UpsertBucket":
        return {
            "upsertBucket": {
                "inserted": True,
                "bucket": {
                    "id": "UnVuOjE=",
                    "name": variables.get("name"),
                    "displayName": variables.get("displayName"),
                    "description": None,
                    "config": "{}",
                    "sweepName": None,
                    "historyLineCount": 0,
                    "project": {
                        "id": "UHJvamVjdDox",
                        "name": variables.get("project") or "uncategorized",
                        "entity": {"id": "RW50aXR5OjE=", "name": variables.get("entity") or ENTITY},
                    },
                },
            }
        }
    if operation == "ServerFeaturesQuery":
        return {"serverInfo": {"features": []}}
    if operation == "OrganizationCoreWeaveOrganizationID":
        return {"entity": {"organization": None}}
    if operation == "CreateRunFiles":
        # wandb-core 0.31 dereferences every file's upload URL: leaving them out makes it panic.
        return {
            "createRunFiles": {
                "runID": "UnVuOjE=",
                "uploadHeaders": [],
                "files": [
                    {"name": name, "uploadUrl": f"{base_url}/upload/{name}"} for name in variables.get("files", [])
                ],
            }
        }
    if operation == "RunResumeStatus":
        return {"model": None}  # no such run yet, so the run is created
    raise UnknownOperation(operation)


# What `wandb.Api()` and wandb-workspaces ask when a report is saved: the login (Viewer), the entity's
# projects (GetProjects; CreateProject for a missing one), the project's internal id, then the report.


def _viewer(variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    return {
        "viewer": {
            "id": "VXNlcjox",
            "entity": ENTITY,
            "username": ENTITY,
            "email": None,
            "flags": "{}",
            "teams": {"edges": []},
        }
    }


def _project(entity: str, name: str) -> dict[str, Any]:
    return {
        "__typename": "Project",
        "id": PROJECT_ID,
        "name": name,
        "entityName": entity,
        "createdAt": "2026-01-01T00:00:00",
        "isBenchmark": False,
        "user": None,
        "description": None,
        "access": "PRIVATE",
        "views": "{}",
    }


def _get_projects(variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    names = sorted(name for entity, name in server.projects if entity == variables.get("entity"))
    return {
        "models": {
            "pageInfo": {"__typename": "PageInfo", "endCursor": None, "hasNextPage": False},
            "edges": [{"node": _project(variables["entity"], name)} for name in names],
        }
    }


def _create_project(variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    entity, name = variables["input"]["entityName"], variables["input"]["name"]
    inserted = (entity, name) not in server.projects
    server.projects.add((entity, name))
    return {"result": {"project": _project(entity, name), "model": _project(entity, name), "inserted": inserted}}


def _project_internal_id(variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    if (variables["entityName"], variables["projectName"]) not in server.projects:
        return {"project": None}
    return {"project": {"id": PROJECT_ID, "internalId": PROJECT_INTERNAL_ID}}


def _upsert_view(variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    if server.refuse:
        raise Refused(server.refuse)
    server.views.append(dict(variables))
    return {
        "upsertView": {
            "inserted": True,
            "view": {
                "id": VIEW_ID,
                "type": variables.get("type"),
                "name": variables.get("name"),
                "displayName": variables.get("displayName"),
                "description": variables.get("description"),
                "project": {
                    "id": PROJECT_ID,
                    "name": variables.get("projectName"),
                    "entityName": variables.get("entityName"),
                },
                "spec": variables.get("spec"),
                "updatedAt": "2026-01-01T00:00:00",
            },
        }
    }


# What `wandb.Api().runs(path, filters={"group": ...})` asks, then each run's config, summary and history.


def _run_node(run: RemoteRun) -> dict[str, Any]:
    return {
        "id": f"UnVuOi{run.id}",
        "name": run.id,
        "displayName": run.name or run.id,
        "projectId": 1,
        "tags": [],
        "sweepName": None,
        "state": "finished",
        "group": run.group,
        "jobType": None,
        "commit": None,
        "readOnly": False,
        "createdAt": "2026-01-01T00:00:00",
        "heartbeatAt": "2026-01-01T00:00:00",
        "description": None,
        "notes": None,
        "historyLineCount": len(run.history),
        "user": {"name": ENTITY, "username": ENTITY},
        "config": json.dumps({k: {"value": v} for k, v in run.config.items()}),
        "summaryMetrics": json.dumps(run.summary),
        "systemMetrics": "{}",
    }


def _runs(variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    filters = json.loads(variables.get("filters") or "{}")
    if set(filters) - {"group"}:
        raise UnknownOperation(f"Runs with filters {sorted(filters)}")  # only the group filter is implemented
    if (variables["entity"], variables["project"]) not in server.projects:
        return {"project": None}
    found = [
        run
        for run in server.runs
        if (run.entity, run.project) == (variables["entity"], variables["project"])
        and run.group == filters.get("group", run.group)
    ]
    return {
        "project": {
            "internalId": PROJECT_INTERNAL_ID,
            "runCount": len(found),
            "readOnly": False,
            "runs": {
                "edges": [{"node": _run_node(run), "cursor": run.id} for run in found],
                "pageInfo": {"endCursor": found[-1].id if found else None, "hasNextPage": False},
            },
        }
    }


def _named_run(variables: dict[str, Any], server: _Server) -> RemoteRun:
    for run in server.runs:
        if (run.entity, run.project, run.id) == (variables["entity"], variables["project"], variables["name"]):
            return run
    raise UnknownOperation(f"a run the server does not hold: {variables}")


def _run_history_keys(variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    run = _named_run(variables, server)
    keys = {key for row in run.history for key in row}
    counts = {
        key: {"typeCounts": [{"type": "number", "count": sum(key in row for row in run.history)}]}
        for key in sorted(keys)
    }
    last = max((row["_step"] for row in run.history), default=0)
    return {"project": {"run": {"historyKeys": {"lastStep": last, "keys": counts}}}}


def _run_parquet_history(variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    # Every row as live data (not yet compacted into parquet files): no parquet file to serve.
    run = _named_run({**variables, "name": variables["runName"]}, server)
    return {"project": {"run": {"parquetHistory": {"parquetUrls": [], "liveData": list(run.history)}}}}


def _history_page(variables: dict[str, Any], server: _Server) -> dict[str, Any]:
    run = _named_run({**variables, "name": variables["run"]}, server)
    rows = [row for row in run.history if variables["minStep"] <= row["_step"] < variables["maxStep"]]
    return {"project": {"run": {"history": [json.dumps(row) for row in rows[: variables["pageSize"]]]}}}


_REPORT_OPERATIONS: dict[str, Callable[[dict[str, Any], _Server], dict[str, Any]]] = {
    "Viewer": _viewer,
    "GetDefaultEntity": _viewer,
    "GetProjects": _get_projects,
    "CreateProject": _create_project,
    "ProjectInternalId": _project_internal_id,
    "upsertView": _upsert_view,
    "Runs": _runs,
    "RunHistoryKeys": _run_history_keys,
    "RunParquetHistory": _run_parquet_history,
    "HistoryPage": _history_page,
}


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
        operation = _operation(request.get("query", ""))
        try:
            data = _graphql_data(operation, request.get("variables") or {}, self.server)
        except UnknownOperation:
            self.server.unknown_operations.append(operation)
            return {"errors": [{"message": f"the fake W&B server does not implement {operation}"}], "data": None}
        except Refused as refused:
            return {"errors": [{"message": str(refused)}], "data": None}
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
        self.unknown_operations: list[str] = []  # GraphQL documents answered with an error
        self.projects: set[tuple[str, str]] = set()  # (entity, project) that exist, created ones included
        self.runs: list[RemoteRun] = []
        self.refuse: str | None = None
        self.views: list[dict[str, Any]] = []  # the variables of every UpsertView: the reports saved
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

    def __init__(
        self,
        drop_when: Callable[[Request], bool] = lambda request: False,
        projects: tuple[tuple[str, str], ...] = (),
        runs: tuple[RemoteRun, ...] = (),
    ) -> None:
        self._drop_when = drop_when
        self.projects: set[tuple[str, str]] = set(projects)  # (entity, project) that exist on the server
        self.runs: list[RemoteRun] = list(runs)  # the runs the server holds, for Api().runs
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

    @property
    def refuse(self) -> str | None:
        """When set, saving a report (upsertView) is refused with this message, as for a missing permission."""
        return self._server.refuse if self._server is not None else None

    @refuse.setter
    def refuse(self, message: str | None) -> None:
        assert self._server is not None, "not started"
        self._server.refuse = message

    @property
    def unknown_operations(self) -> list[str]:
        """The GraphQL documents this fake does not implement that arrived (each answered with an error)."""
        return list(self._server.unknown_operations) if self._server is not None else []

    @property
    def views(self) -> list[dict[str, Any]]:
        """The variables of every UpsertView received: the reports saved, in order."""
        return list(self._server.views) if self._server is not None else []

    def start(self) -> FakeWandbServer:
        self._server = _Server(self._on_request)
        self._server.projects, self._server.runs = self.projects, self.runs  # shared: a test may add more
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-wandb-server", daemon=True
        )
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
            self._thread.join(timeout=5)  # a bound only: shutdown() above already ended serve_forever
