"""The SDK against a real cluster that requires TLS client certificates and bearer tokens
(docs/security.md), as an operator would run one: certificates from ``idemctl dev-certs``,
a tokens file with a tenant token and an admin token. The unit tests prove what the SDK puts
on the wire; only real nodes prove that it is what they accept, that their refusals come back
as determinate errors a caller can act on, and that a client the nodes cannot verify (or that
cannot verify them) gets an error and stores nothing. The TypeScript analogue is
sdk/typescript/test/integration/client.test.ts."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import subprocess

import grpc
import pytest

import idemraft
from idemraft import AsyncClient, Client, ClientConfig, StoredResponse

from cluster import Cluster, bin_dir, binaries_present

# Tokens are secrets, so they are drawn fresh; nothing a test asserts depends on their value.
TENANT_TOKEN = secrets.token_hex(32)
OTHER_TENANT_TOKEN = secrets.token_hex(32)
ADMIN_TOKEN = secrets.token_hex(32)


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _prepare(d):
    ctl = str(bin_dir() / "idemctl")
    for sub in ("certs", "other-ca"):
        # A second, unrelated CA and client certificate: what a client of another cluster holds.
        subprocess.run([ctl, "dev-certs", str(d / sub)], check=True, capture_output=True, timeout=30)
    (d / "tokens.toml").write_text(
        '[[token]]\nname = "acme"\ntenant = "acme"\nsha256 = "%s"\n\n'
        '[[token]]\nname = "globex"\ntenant = "globex"\nsha256 = "%s"\n\n'
        '[[token]]\nname = "operator"\nadmin = true\nsha256 = "%s"\n'
        % (_sha(TENANT_TOKEN), _sha(OTHER_TENANT_TOKEN), _sha(ADMIN_TOKEN))
    )


def _node_args(node, d):
    c = d / "certs"
    return [
        "--tls-cert", c / ("node-%d.pem" % node),
        "--tls-key", c / ("node-%d.key" % node),
        "--tls-client-ca", c / "ca.pem",
        "--tokens-file", d / "tokens.toml",
    ]


def _ctl_args(d):
    c = d / "certs"
    return ["--ca", c / "ca.pem", "--cert", c / "client.pem", "--key", c / "client.key"]


@pytest.fixture(scope="module")
def secured():
    """Its own cluster: the plaintext one the other integration tests share cannot be given
    TLS, and a secured one would lock them out."""
    if not binaries_present():
        pytest.fail(
            "the idemraft node binary is not in %s: run `cargo build -p idemraft-node -p idemctl` "
            "or set IDEMRAFT_BIN to the directory holding idemraft and idemctl" % bin_dir()
        )
    c = Cluster(3, prepare=_prepare, node_args=_node_args, ctl_args=_ctl_args, ctl_env={"IDEMCTL_TOKEN": ADMIN_TOKEN})
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _config(cluster, token=None, *, endpoints=None, ca="certs", cert="certs", deadline=5.0, **kw) -> ClientConfig:
    """A config whose CA and client certificate come from ``ca``/``cert`` (a dev-certs
    directory, or None for none)."""
    cfg = ClientConfig(list(endpoints or cluster.endpoints), bearer_token=token, deadline=deadline, **kw)
    if ca is None:
        return cfg
    pair = (cluster.dir / cert / "client.pem", cluster.dir / cert / "client.key") if cert else (None, None)
    return cfg.with_tls_files(cluster.dir / ca / "ca.pem", *pair)


def _key(rng, name):
    return "tls-%016x-%s" % (rng.getrandbits(64), name)


def test_a_tenant_token_with_a_client_certificate_claims_completes_and_replays(secured, rng):
    key = _key(rng, "roundtrip")
    with Client(_config(secured, TENANT_TOKEN)) as c:
        assert all(e.startswith("https://") for e in c.endpoints()), c.endpoints()
        o = c.claim("py.tls", key, "owner-1", lease=10)
        assert isinstance(o, idemraft.Acquired), o
        assert isinstance(c.complete("py.tls", key, o.token, StoredResponse(201, (("location", "/c/1"),), b"\x00paid\xff")), idemraft.Completed)
        r = c.claim("py.tls", key, "owner-2")
        assert isinstance(r, idemraft.Replay) and r.token == o.token, r
        assert (r.response.status, r.response.headers, r.response.body) == (201, (("location", "/c/1"),), b"\x00paid\xff")
        rec = c.get("py.tls", key)
        # The config names no tenant: the node takes it from the token.
        assert rec.tenant == "acme" and rec.state == idemraft.RecordState.COMPLETED
        page = c.list(scope="py.tls", state=idemraft.RecordState.COMPLETED)
        assert any(x.key == key for x in page.records) and all(x.tenant == "acme" for x in page.records)

    # Another tenant's token sees none of it: the same key is a different, fresh record.
    with Client(_config(secured, OTHER_TENANT_TOKEN)) as other:
        assert other.get("py.tls", key) is None
        mine = other.claim("py.tls", key, "owner-g", lease=10)
        assert isinstance(mine, idemraft.Acquired) and mine.attempt == 1, mine


def test_a_client_given_one_follower_reaches_the_leader_over_tls(secured, rng):
    leader = secured.leader()
    follower = next(n for n in range(1, secured.size + 1) if n != leader)
    follower_ep = secured.endpoints[follower - 1]

    async def go():
        # The leader's address the follower hands back has no scheme: the client must dial it
        # with TLS, the CA and its certificate, like the endpoints it was given.
        async with AsyncClient(_config(secured, TENANT_TOKEN, endpoints=[follower_ep])) as c:
            o = await c.claim("py.tls", _key(rng, "hint"), "owner-1", lease=10)
            assert isinstance(o, idemraft.Acquired), o
            assert c.endpoints() == ["https://" + follower_ep, "https://" + secured.endpoints[leader - 1]]
            o2 = await c.claim("py.tls", _key(rng, "hint2"), "owner-1", lease=10)
            assert isinstance(o2, idemraft.Acquired), o2

    asyncio.run(go())


def _refused(fn, code, words):
    with pytest.raises(idemraft.RpcError) as info:
        fn()
    e = info.value
    assert e.code == code and words in e.message, e
    # Refused before anything happened: the caller must not be told to retry.
    assert not e.indeterminate, e
    return e


def test_a_missing_unknown_or_wrong_kind_of_token_is_refused_and_stores_nothing(secured, rng):
    key = _key(rng, "refused")
    with Client(_config(secured, None)) as none, Client(_config(secured, "x" + TENANT_TOKEN)) as unknown, Client(
        _config(secured, ADMIN_TOKEN)
    ) as admin, Client(_config(secured, TENANT_TOKEN, tenant="globex")) as wrong_tenant, Client(
        _config(secured, TENANT_TOKEN)
    ) as good:
        unauth = grpc.StatusCode.UNAUTHENTICATED
        denied = grpc.StatusCode.PERMISSION_DENIED
        _refused(lambda: none.claim("py.tls", key, "owner-1", lease=10), unauth, "requires a bearer token")
        _refused(lambda: none.get("py.tls", key), unauth, "requires a bearer token")
        _refused(lambda: unknown.claim("py.tls", key, "owner-1", lease=10), unauth, "not in this node's tokens file")
        # An admin token has no tenant, so it cannot own records.
        _refused(lambda: admin.claim("py.tls", key, "owner-1", lease=10), denied, "needs a token with a tenant")
        # A tenant named in the config that is not the token's is refused, not overridden.
        _refused(lambda: wrong_tenant.claim("py.tls", key, "owner-1", lease=10), denied, "the token is for tenant 'acme'")
        assert good.get("py.tls", key) is None, "a refused claim stored a record"


def test_a_client_the_nodes_cannot_verify_or_that_cannot_verify_them_gets_an_error(secured, rng):
    cases = {
        "no client certificate": dict(cert=None),
        "a client certificate from another CA": dict(cert="other-ca"),
        "trusting another CA": dict(ca="other-ca", cert="other-ca"),
        "trusting another CA, with a good client certificate": dict(ca="other-ca", cert="certs"),
        "plaintext": dict(ca=None, endpoints=["http://" + e for e in secured.endpoints]),
    }
    keys = {}

    async def attempt(name, kw):
        keys[name] = _key(rng, "untrusted")
        async with AsyncClient(_config(secured, TENANT_TOKEN, deadline=1.5, **kw)) as c:
            try:
                o = await c.claim("py.tls", keys[name], "owner-1", lease=10)
            except (idemraft.Unavailable, idemraft.OutcomeUnknown) as e:
                return e
            raise AssertionError("%s: the claim succeeded: %r" % (name, o))

    async def go():
        return await asyncio.gather(*(attempt(n, kw) for n, kw in cases.items()))

    errors = asyncio.run(go())
    assert len(errors) == len(cases)
    with Client(_config(secured, TENANT_TOKEN)) as good:
        for name in cases:
            assert good.get("py.tls", keys[name]) is None, "%s: a claim over a refused connection stored a record" % name


def test_only_the_admin_token_reads_and_sets_quotas_and_they_bind_the_tokens_tenant(secured, rng):
    with Client(_config(secured, OTHER_TENANT_TOKEN)) as tenant, Client(_config(secured, ADMIN_TOKEN)) as admin:
        denied = grpc.StatusCode.PERMISSION_DENIED
        _refused(lambda: tenant.set_quota("globex", 1000), denied, "needs an admin token")
        _refused(lambda: tenant.get_quota("globex"), denied, "needs an admin token")
        _refused(lambda: tenant.node_status(0), denied, "needs an admin token")
        assert admin.discover() == secured.leader()

        held = _key(rng, "quota-held")
        first = tenant.claim("py.tls", held, "owner-1", lease=30)
        assert isinstance(first, idemraft.Acquired), first
        count = next(t.records for t in admin.get_quota("globex").tenants if t.tenant == "globex")
        try:
            q = admin.set_quota("globex", count)
            assert any(t.tenant == "globex" and t.max_records == count for t in q.tenants), q
            # The client names no tenant; the quota that applies is the token's tenant's.
            with pytest.raises(idemraft.QuotaExceeded) as info:
                tenant.claim("py.tls", _key(rng, "quota-new"), "owner-1", lease=10)
            e = info.value
            assert (e.tenant, e.limit, e.records, e.indeterminate) == ("globex", count, count, False), e
            again = tenant.claim("py.tls", held, "owner-1", lease=30)
            assert isinstance(again, idemraft.Acquired) and again.token == first.token, again
            # Another tenant is not held to globex's quota.
            with Client(_config(secured, TENANT_TOKEN)) as acme:
                assert isinstance(acme.claim("py.tls", _key(rng, "quota-acme"), "owner-1", lease=10), idemraft.Acquired)
        finally:
            admin.set_quota("globex", None)
        assert isinstance(tenant.claim("py.tls", _key(rng, "quota-after"), "owner-1", lease=10), idemraft.Acquired)
