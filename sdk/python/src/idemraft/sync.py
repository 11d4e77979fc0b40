"""The blocking client, for code without an event loop (Django, Flask, scripts, workers).

It owns one background thread running an event loop with an ``AsyncClient`` on it, so the
two clients share every rule (retries, leader discovery, error taxonomy) and the sync one
adds only the hand-off. ``execute`` runs the work in the calling thread, while the lease is
kept alive from the background loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, Optional, Sequence, Union

from . import errors as E
from .aio import AsyncClient, ClientConfig, RetryableWorkError, TerminalWorkError, WorkGrant
from .fingerprint import Fingerprint
from .types import Executed, StoredResponse


class Client:
    """A blocking connection to an Idemraft cluster; thread-safe, share one per process.
    Every method has the ``AsyncClient`` method's signature and meaning. ``close()`` when
    done, or use it as a context manager."""

    def __init__(self, config: Union[ClientConfig, Sequence[str]], **overrides):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="idemraft-client", daemon=True)
        self._thread.start()

        async def make():
            return AsyncClient(config, **overrides)

        try:
            self._aio = self._run(make())
        except BaseException:
            self._stop()
            raise

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop(self):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    @property
    def config(self) -> ClientConfig:
        return self._aio.config

    @property
    def aio(self) -> AsyncClient:
        """The asynchronous client underneath (bound to this client's own loop)."""
        return self._aio

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self._run(self._aio.close())
            finally:
                self._stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def endpoints(self):
        return self._aio.endpoints()

    def claim(self, scope, key, owner, **kw):
        return self._run(self._aio.claim(scope, key, owner, **kw))

    def complete(self, scope, key, token, response, **kw):
        return self._run(self._aio.complete(scope, key, token, response, **kw))

    def fail(self, scope, key, token, retryable, response=None, **kw):
        return self._run(self._aio.fail(scope, key, token, retryable, response, **kw))

    def extend_lease(self, scope, key, token, lease=None, **kw):
        return self._run(self._aio.extend_lease(scope, key, token, lease, **kw))

    def checkpoint(self, scope, key, token, recovery_point, data=b"", lease=None, **kw):
        return self._run(self._aio.checkpoint(scope, key, token, recovery_point, data, lease, **kw))

    def takeover(self, scope, key, owner, **kw):
        return self._run(self._aio.takeover(scope, key, owner, **kw))

    def get(self, scope, key, **kw):
        return self._run(self._aio.get(scope, key, **kw))

    def wait(self, scope, key, timeout):
        return self._run(self._aio.wait(scope, key, timeout))

    def list(self, **kw):
        return self._run(self._aio.list(**kw))

    def node_status(self, index, **kw):
        return self._run(self._aio.node_status(index, **kw))

    def discover(self):
        return self._run(self._aio.discover())

    def set_quota(self, tenant, max_records):
        return self._run(self._aio.set_quota(tenant, max_records))

    def get_quota(self, tenant=None):
        return self._run(self._aio.get_quota(tenant))

    def execute(
        self,
        scope: str,
        key: str,
        fingerprint: Optional[Union[Fingerprint, bytes]],
        fn: Callable[[WorkGrant], StoredResponse],
        *,
        lease: float = 30.0,
        ttl: Optional[float] = None,
        deadline: float = 30.0,
        owner: Optional[str] = None,
        allow_takeover: bool = True,
    ) -> Executed:
        """``AsyncClient.execute`` with a plain function, run in the calling thread."""
        a = self._aio
        grant = self._run(a._claim_for_execute(scope, key, fingerprint, lease, ttl, deadline, owner, allow_takeover))
        if isinstance(grant, Executed):
            return grant
        started = threading.Event()
        box = {}

        async def work(wg: WorkGrant):
            # The lease keeper runs on the loop while the work runs in the caller's thread.
            done = asyncio.Event()
            box["grant"], box["done"] = wg, done
            started.set()
            await done.wait()
            if "error" in box:
                raise box["error"]
            return box["result"]

        fut = asyncio.run_coroutine_threadsafe(
            a.run_granted(scope, key, grant, work, lease=lease, settle_timeout=deadline), self._loop
        )
        while not started.wait(0.05):
            if fut.done():
                return fut.result()
        try:
            box["result"] = fn(box["grant"])
        except BaseException as e:  # handed to run_granted, which settles and re-raises it
            box["error"] = e
        finally:
            self._loop.call_soon_threadsafe(box["done"].set)
        return fut.result()


__all__ = ["Client", "ClientConfig", "RetryableWorkError", "TerminalWorkError", "WorkGrant", "E"]
