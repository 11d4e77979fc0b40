"""A real 3-node Idemraft cluster for the integration tests: ``idemraft`` processes on free
loopback ports, in a temporary directory, killed at the end whatever happens.

The node binary is found in the directory named by ``IDEMRAFT_BIN``, else in
``<repo>/target/debug``. Readiness is ``idemctl status`` reporting a leader on every node.
Ports of a quick-start cluster (7101-7105, 7201-7205, 7301-7305) are never used.

A secured cluster (TLS, client certificates, bearer tokens) is the same cluster with more
flags: ``prepare`` writes its files into the temporary directory before any node starts, and
``ctl_args``/``ctl_env`` give readiness checks the credentials such a node asks of ``idemctl``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

REPO = Path(__file__).resolve().parents[3]
RESERVED = set(range(7100, 7110)) | set(range(7200, 7210)) | set(range(7300, 7310))


def bin_dir() -> Path:
    return Path(os.environ.get("IDEMRAFT_BIN") or REPO / "target" / "debug")


def binaries_present() -> bool:
    d = bin_dir()
    return (d / "idemraft").is_file() and (d / "idemctl").is_file()


def free_ports(n: int) -> List[int]:
    """``n`` distinct loopback ports nothing listens on now (held open together while
    chosen, so they differ)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
            socks.append(s)
            if p not in RESERVED:
                ports.append(p)
    finally:
        for s in socks:
            s.close()
    return ports


class Cluster:
    """Three nodes. ``endpoints`` are the client addresses.

    ``node_args(node, dir)`` adds flags to a node's command line, ``prepare(dir)`` runs once
    before the first node starts (inside ``start``, so a failure there still cleans up), and
    ``ctl_args``/``ctl_env`` are added to every ``idemctl`` call the harness makes."""

    def __init__(
        self,
        size: int = 3,
        *,
        node_args: Optional[Callable[[int, Path], Sequence[str]]] = None,
        prepare: Optional[Callable[[Path], None]] = None,
        ctl_args: Optional[Callable[[Path], Sequence[str]]] = None,
        ctl_env: Optional[Mapping[str, str]] = None,
    ):
        self.size = size
        self.node_args = node_args
        self.prepare = prepare
        self.ctl_args = ctl_args
        self.ctl_env = dict(ctl_env or {})
        self.dir = Path(tempfile.mkdtemp(prefix="idemraft-py-"))
        ports = free_ports(3 * size)
        self.client_ports = ports[0:size]
        self.peer_ports = ports[size : 2 * size]
        self.http_ports = ports[2 * size : 3 * size]
        self.procs: Dict[int, subprocess.Popen] = {}
        self._killed = set()
        self.logs: Dict[int, object] = {}
        self.initial = ",".join("%d=127.0.0.1:%d" % (i + 1, p) for i, p in enumerate(self.peer_ports))

    @property
    def endpoints(self) -> List[str]:
        return ["127.0.0.1:%d" % p for p in self.client_ports]

    def start(self, timeout: float = 60.0) -> "Cluster":
        try:
            if self.prepare is not None:
                self.prepare(self.dir)
            for node in range(1, self.size + 1):
                self.start_node(node)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, node: int) -> None:
        i = node - 1
        log = open(self.dir / ("node-%d.log" % node), "ab")
        self.logs[node] = log
        args = [
            str(bin_dir() / "idemraft"),
            "--id", str(node),
            "--initial-cluster", self.initial,
            "--client-addr", "127.0.0.1:%d" % self.client_ports[i],
            "--peer-addr", "127.0.0.1:%d" % self.peer_ports[i],
            "--http-addr", "127.0.0.1:%d" % self.http_ports[i],
            "--data-dir", str(self.dir / ("node-%d" % node)),
        ]
        if self.node_args is not None:
            args += [str(a) for a in self.node_args(node, self.dir)]
        self.procs[node] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def ctl(self, *args: str, timeout: float = 5) -> subprocess.CompletedProcess:
        """``idemctl`` with this cluster's credentials; the caller's environment is kept
        (minus any IDEMCTL_* settings, which would point it at another cluster)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}
        env.update(self.ctl_env)
        extra = [str(a) for a in self.ctl_args(self.dir)] if self.ctl_args is not None else []
        return subprocess.run(
            [str(bin_dir() / "idemctl"), *extra, *args],
            capture_output=True, timeout=timeout, check=False, env=env, stdin=subprocess.DEVNULL,
        )

    def status(self, node: int) -> Optional[dict]:
        """The node's own status via ``idemctl``, or None if it does not answer."""
        try:
            out = self.ctl("--endpoints", self.endpoints[node - 1], "--timeout", "1s", "-w", "json", "status")
        except subprocess.TimeoutExpired:
            return None
        if out.returncode != 0:
            return None
        try:
            rows = json.loads(out.stdout)
        except ValueError:
            return None
        return rows[0] if rows and "leader_id" in rows[0] else None

    def alive(self) -> List[int]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every running node reports the same non-zero leader, which is running."""
        end = time.monotonic() + timeout
        last = {}
        while time.monotonic() < end:
            for n, p in self.procs.items():
                if p.poll() is not None and n not in self.killed():
                    raise RuntimeError("node %d exited with %s; log:\n%s" % (n, p.returncode, self.log_tail(n)))
            last = {n: self.status(n) for n in self.alive()}
            leaders = {s["leader_id"] if s else 0 for s in last.values()}
            if len(leaders) == 1 and 0 not in leaders and leaders.pop() in self.alive():
                return
            time.sleep(0.2)
        raise RuntimeError("no common leader within %ss: %s" % (timeout, last))

    def leader(self, timeout: float = 10.0) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for n in self.alive():
                s = self.status(n)
                if s and s["leader_id"] == s["id"] and s.get("role") == "leader":
                    return n
            time.sleep(0.1)
        raise RuntimeError("no leader within %ss" % timeout)

    def kill(self, node: int) -> None:
        p = self.procs[node]
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
        self._killed.add(node)

    def killed(self) -> set:
        return self._killed

    def kill_leader(self) -> int:
        n = self.leader()
        self.kill(n)
        return n

    def restart_killed(self, timeout: float = 60.0) -> None:
        for n in sorted(self.killed()):
            if self.procs[n].poll() is not None:
                self.start_node(n)
        self.killed().clear()
        self.wait_ready(timeout)

    def log_tail(self, node: int, lines: int = 30) -> str:
        try:
            text = (self.dir / ("node-%d.log" % node)).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for f in self.logs.values():
            f.close()
        shutil.rmtree(self.dir, ignore_errors=True)
