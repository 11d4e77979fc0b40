"""Every scenario of sdk/conformance/scenarios.json against a real 3-node cluster: client
scenarios through AsyncClient, HTTP scenarios through the middleware in FastAPI and in
Starlette. A scenario that killed a node gets it restarted before the next one runs."""

import asyncio

import pytest

from conformance import Runner, load

DOC = load()
CLIENT = [s for s in DOC["scenarios"] if s["kind"] == "client"]
HTTP = [s for s in DOC["scenarios"] if s["kind"] == "http"]


def test_the_file_is_well_formed():
    names = [s["name"] for s in DOC["scenarios"]]
    assert DOC["version"] == 1
    assert len(names) == len(set(names)), "duplicate scenario names"
    assert len(CLIENT) >= 15 and len(HTTP) >= 10
    ops = {st["op"] for s in DOC["scenarios"] for st in s["steps"]}
    assert {"claim", "complete", "fail", "extend_lease", "checkpoint", "takeover", "get", "wait", "list",
            "execute", "request", "kill_leader", "join", "counter"} <= ops
    for s in DOC["scenarios"]:
        assert ("leader_kill" in s.get("tags", [])) == any(st["op"] == "kill_leader" for st in s["steps"]), s["name"]


def run(cluster, scenario, framework=None):
    try:
        asyncio.run(asyncio.wait_for(Runner(scenario, cluster, DOC["defaults"], framework).run(), 240))
    finally:
        if cluster.killed():
            cluster.restart_killed()


@pytest.mark.parametrize("scenario", CLIENT, ids=[s["name"] for s in CLIENT])
def test_client_scenario(cluster, scenario):
    run(cluster, scenario)


@pytest.mark.parametrize("framework", ["fastapi", "starlette"])
@pytest.mark.parametrize("scenario", HTTP, ids=[s["name"] for s in HTTP])
def test_http_scenario(cluster, scenario, framework):
    run(cluster, scenario, framework)
