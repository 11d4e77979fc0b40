"""Shared test fixtures: where the repository is, and the seeded randomness every test that
draws random values uses (the seed is printed on failure)."""

import os
import random
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def pytest_report_header(config):
    return "idemraft test seed: %s" % SEED


SEED = int(os.environ.get("IDEMRAFT_TEST_SEED") or random.SystemRandom().randrange(1, 2**31))


@pytest.fixture
def rng(request):
    """A random generator seeded per test from the run's seed; the seed is reported when
    the test fails (rerun with IDEMRAFT_TEST_SEED=<seed>)."""
    seed = SEED ^ (hash(request.node.nodeid) & 0x7FFFFFFF)
    r = random.Random(seed)
    yield r
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print("\n[idemraft] %s failed with IDEMRAFT_TEST_SEED=%d (test seed %d)" % (request.node.nodeid, SEED, seed))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
    if rep.when == "call" and rep.failed:
        rep.sections.append(("idemraft seed", "rerun with IDEMRAFT_TEST_SEED=%d" % SEED))


@pytest.fixture(scope="session")
def cluster():
    """One real 3-node cluster for the session's integration tests, killed at the end."""
    from cluster import Cluster, bin_dir, binaries_present

    if not binaries_present():
        pytest.fail(
            "the idemraft node binary is not in %s: run `cargo build -p idemraft-node -p idemctl` "
            "or set IDEMRAFT_BIN to the directory holding idemraft and idemctl" % bin_dir()
        )
    c = Cluster(3).start()
    try:
        yield c
    finally:
        c.stop()
