"""A stand-in for the W&B server behind `wandb.Api`, for the experiment driver's test of the report it
builds at the end (tests/test_analysis_experiment.py). The W&B report's own tests and `--from_wandb` run
the real client against tests/wandb_server.py instead.

wandb-workspaces reaches W&B only through `wandb.Api()`: GraphQL documents go to the API's
`_service_api.execute_graphql`, and `projects`, `create_project` and `default_entity` are plain
methods and attributes. The stub answers the two documents a report's save sends (the project's
internal id, then `upsertView`) the way the server's schema says, and records every request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

APP_URL = "https://wandb.stub"
VIEW_ID = "VmlldzoxMjM0NQ=="


@dataclass
class StubBackend:
    runs: list[Any] = field(default_factory=list)  # what Api().runs(...) returns
    entity: str = "stub-user"  # the login's default entity
    fail_with: Exception | None = None  # raised by every GraphQL request
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    runs_asked: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    app_url: str = APP_URL

    def execute_graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        variables = dict(variables or {})
        self.requests.append((query, variables))
        if self.fail_with is not None:
            raise self.fail_with
        if "ProjectInternalId" in query:
            return {"project": {"id": "UHJvamVjdDox", "internalId": "internal-1"}}
        if "upsertView" in query:
            view = {
                "id": VIEW_ID,
                "type": variables["type"],
                "name": variables["name"],
                "displayName": variables["displayName"],
                "description": variables["description"],
                "project": {
                    "id": "UHJvamVjdDox",
                    "name": variables["projectName"],
                    "entityName": variables["entityName"],
                },
                "spec": variables["spec"],
                "updatedAt": "2026-01-01T00:00:00",
            }
            return {"upsertView": {"view": view, "inserted": True}}
        raise AssertionError(f"the stub does not know this request: {query.split('(')[0].strip()}")

    def saved_specs(self) -> list[dict[str, Any]]:
        """The report specs sent with upsertView, parsed."""
        return [json.loads(v["spec"]) for q, v in self.requests if "upsertView" in q]


class StubApi:
    """What `wandb.Api()` returns while the stub is installed."""

    def __init__(self, backend: StubBackend) -> None:
        self._service_api = backend  # in the instance __dict__, where wandb_workspaces looks for it
        self.default_entity = backend.entity

    def projects(self, entity: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(name="gpt2-strategies")]

    def create_project(self, name: str, entity: str) -> None:
        pass

    def runs(self, path: str, filters: dict[str, Any] | None = None) -> list[Any]:
        self._service_api.runs_asked.append((path, dict(filters or {})))
        return list(self._service_api.runs)


def install(monkeypatch: Any, backend: StubBackend) -> StubBackend:
    """Route `wandb.Api()` to the stub and look logged in (a key in the environment, never used)."""
    import wandb

    monkeypatch.setattr(wandb, "Api", lambda *args, **kwargs: StubApi(backend))
    monkeypatch.setenv("WANDB_API_KEY", "stub-key-not-used")
    return backend


def log_out(monkeypatch: Any, tmp_path: Any) -> None:
    """No W&B credentials in the environment or in a netrc file."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
