// Test harness: a 3-node Idemraft cluster of real `idemraft` processes on free loopback ports
// in a temporary directory, for the integration tests and the conformance runner. Nodes are
// killed when the cluster is stopped, when the test process exits (also on failure) and on
// SIGINT/SIGTERM, so no test leaves a node behind.
//
// The binaries are found in the directory named by IDEMRAFT_BIN, else in <repo>/target/debug.

import { spawn, execFile, type ChildProcess } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";

/** The package root (holding package.json), found from this file's place in the build. */
export function packageRoot(): string {
  let dir = __dirname;
  for (let i = 0; i < 8; i++) {
    const p = path.join(dir, "package.json");
    if (fs.existsSync(p) && JSON.parse(fs.readFileSync(p, "utf8")).name === "@idemraft/client") return dir;
    dir = path.dirname(dir);
  }
  throw new Error("cannot find the @idemraft/client package root above " + __dirname);
}

/** The repository root: the package lives in <repo>/sdk/typescript. */
export function repoRoot(): string {
  return path.resolve(packageRoot(), "..", "..");
}

export function binDir(): string {
  return process.env.IDEMRAFT_BIN ?? path.join(repoRoot(), "target", "debug");
}

/** The user's quick-start cluster may hold these; tests never use them. */
function reserved(port: number): boolean {
  return (port >= 7101 && port <= 7105) || (port >= 7201 && port <= 7205) || (port >= 7301 && port <= 7305);
}

/** `n` distinct loopback ports that were free a moment ago. */
export async function freePorts(n: number): Promise<number[]> {
  const ports = new Set<number>();
  for (let tries = 0; ports.size < n && tries < n * 20; tries++) {
    const port = await new Promise<number>((resolve, reject) => {
      const srv = net.createServer();
      srv.once("error", reject);
      srv.listen(0, "127.0.0.1", () => {
        const a = srv.address();
        const p = typeof a === "object" && a !== null ? a.port : 0;
        srv.close(() => resolve(p));
      });
    });
    if (port > 0 && !reserved(port)) ports.add(port);
  }
  if (ports.size < n) throw new Error(`could not find ${n} free loopback ports`);
  return [...ports];
}

const live = new Set<ChildProcess>();
let hooked = false;

function killAllNow(): void {
  for (const p of live) {
    try {
      p.kill("SIGKILL");
    } catch {
      // Already gone.
    }
  }
  live.clear();
}

function hookExit(): void {
  if (hooked) return;
  hooked = true;
  process.on("exit", killAllNow);
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    process.once(sig, () => {
      killAllNow();
      process.exit(128 + (sig === "SIGINT" ? 2 : 15));
    });
  }
}

export interface NodeSpec {
  id: number;
  clientPort: number;
  peerPort: number;
  httpPort: number;
  dataDir: string;
  args: string[];
}

export interface ClusterOptions {
  /** Extra flags for node `id` (TLS, tokens). */
  extraArgs?: (id: number, dir: string) => string[];
  /** Flags for idemctl status calls (e.g. --ca for a TLS cluster), given the temp dir. */
  ctlArgs?: (dir: string) => string[];
  /** Environment for idemctl (e.g. IDEMCTL_TOKEN). */
  ctlEnv?: Record<string, string>;
  /** Called with the temp dir before the nodes start (to write certificates, tokens files). */
  prepare?: (dir: string) => Promise<void> | void;
}

/** A node's status as `idemctl -w json status` prints it. */
interface CtlStatus {
  endpoint: string;
  id?: number;
  leader_id?: number;
  role?: string;
  error?: string;
}

export class Cluster {
  readonly nodes: NodeSpec[] = [];
  private readonly procs = new Map<number, ChildProcess>();
  private readonly killed = new Set<number>();

  private constructor(
    readonly dir: string,
    private readonly opts: ClusterOptions,
  ) {}

  /** Client addresses of the nodes, in id order. */
  get endpoints(): string[] {
    return this.nodes.map((n) => `127.0.0.1:${n.clientPort}`);
  }

  static async start(opts: ClusterOptions = {}): Promise<Cluster> {
    const bin = binDir();
    for (const exe of ["idemraft", "idemctl"]) {
      if (!fs.existsSync(path.join(bin, exe))) {
        throw new Error(
          `${exe} not found in ${bin}: build it with \`cargo build -p idemraft-node -p idemctl --bins\` ` +
            "or set IDEMRAFT_BIN to the directory holding it",
        );
      }
    }
    hookExit();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "idemraft-ts-"));
    const cluster = new Cluster(dir, opts);
    try {
      await opts.prepare?.(dir);
      const ports = await freePorts(9);
      const initial = [1, 2, 3].map((id, i) => `${id}=127.0.0.1:${ports[3 + i]}`).join(",");
      for (const [i, id] of [1, 2, 3].entries()) {
        const spec: NodeSpec = {
          id,
          clientPort: ports[i],
          peerPort: ports[3 + i],
          httpPort: ports[6 + i],
          dataDir: path.join(dir, `node-${id}`),
          args: [],
        };
        spec.args = [
          "--id", String(id),
          "--initial-cluster", initial,
          "--client-addr", `127.0.0.1:${spec.clientPort}`,
          "--peer-addr", `127.0.0.1:${spec.peerPort}`,
          "--http-addr", `127.0.0.1:${spec.httpPort}`,
          "--data-dir", spec.dataDir,
          ...(opts.extraArgs?.(id, dir) ?? []),
        ];
        cluster.nodes.push(spec);
      }
      for (const n of cluster.nodes) cluster.spawnNode(n);
      await cluster.waitReady(30_000);
      return cluster;
    } catch (e) {
      const logs = cluster.logTails();
      await cluster.stop();
      throw new Error(`${(e as Error).message}\n${logs}`);
    }
  }

  private spawnNode(n: NodeSpec): void {
    const log = fs.openSync(path.join(this.dir, `node-${n.id}.log`), "a");
    const p = spawn(path.join(binDir(), "idemraft"), n.args, {
      stdio: ["ignore", log, log],
      env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "warn" },
    });
    fs.closeSync(log);
    live.add(p);
    p.once("exit", () => live.delete(p));
    this.procs.set(n.id, p);
  }

  /** The last lines of every node's log, for a failure message. */
  logTails(lines = 15): string {
    return this.nodes
      .map((n) => {
        const f = path.join(this.dir, `node-${n.id}.log`);
        const text = fs.existsSync(f) ? fs.readFileSync(f, "utf8") : "";
        return `--- node ${n.id} log (tail) ---\n${text.split("\n").slice(-lines).join("\n")}`;
      })
      .join("\n");
  }

  /** `idemctl -w json status` for these endpoints. */
  async status(endpoints: string[] = this.endpoints): Promise<CtlStatus[]> {
    const args = ["--endpoints", endpoints.join(","), "--timeout", "1s", "-w", "json", ...(this.opts.ctlArgs?.(this.dir) ?? []), "status"];
    const out = await new Promise<string>((resolve) => {
      execFile(
        path.join(binDir(), "idemctl"),
        args,
        { timeout: 10_000, env: { ...process.env, ...(this.opts.ctlEnv ?? {}) } },
        // A node that is down makes idemctl exit nonzero; its JSON still says which.
        (_err, stdout) => resolve(String(stdout)),
      );
    });
    try {
      const parsed = JSON.parse(out);
      return Array.isArray(parsed) ? parsed : [];
    } catch {
      return [];
    }
  }

  /** Waits until every live node reports a leader; throws after `timeoutMs`. */
  async waitReady(timeoutMs: number): Promise<void> {
    const end = Date.now() + timeoutMs;
    const want = this.nodes.filter((n) => !this.killed.has(n.id)).map((n) => `127.0.0.1:${n.clientPort}`);
    let last: CtlStatus[] = [];
    for (let i = 0; i < 1000 && Date.now() < end; i++) {
      last = await this.status(want);
      if (last.length === want.length && last.every((s) => (s.leader_id ?? 0) > 0)) return;
      await new Promise((r) => setTimeout(r, 200));
    }
    throw new Error(`the cluster did not report a leader on every node within ${timeoutMs} ms: ${JSON.stringify(last)}`);
  }

  /** The id of the node that says it leads, waiting up to `timeoutMs` for one. */
  async leader(timeoutMs = 10_000): Promise<number> {
    const end = Date.now() + timeoutMs;
    for (let i = 0; i < 1000 && Date.now() < end; i++) {
      const live = this.nodes.filter((n) => !this.killed.has(n.id)).map((n) => `127.0.0.1:${n.clientPort}`);
      const st = await this.status(live);
      const leader = st.find((s) => s.id !== undefined && s.leader_id === s.id && s.role === "leader");
      if (leader?.id !== undefined) return leader.id;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`no node said it leads within ${timeoutMs} ms`);
  }

  /** SIGKILLs node `id`. */
  kill(id: number): void {
    const p = this.procs.get(id);
    if (p !== undefined && p.exitCode === null && p.signalCode === null) p.kill("SIGKILL");
    this.killed.add(id);
  }

  /** SIGKILLs the current leader; returns its id. */
  async killLeader(timeoutMs = 10_000): Promise<number> {
    const id = await this.leader(timeoutMs);
    this.kill(id);
    return id;
  }

  /** Whether any node was killed and not restarted yet. */
  get degraded(): boolean {
    return this.killed.size > 0;
  }

  /** Restarts every killed node with its old flags, ports and data, and waits for a leader on all. */
  async restartKilled(timeoutMs = 30_000): Promise<void> {
    for (const id of [...this.killed]) {
      const p = this.procs.get(id);
      if (p !== undefined && p.exitCode === null && p.signalCode === null) {
        await new Promise<void>((resolve) => {
          p.once("exit", () => resolve());
          p.kill("SIGKILL");
        });
      }
      const spec = this.nodes.find((n) => n.id === id);
      if (spec !== undefined) this.spawnNode(spec);
      this.killed.delete(id);
    }
    await this.waitReady(timeoutMs);
  }

  /** Kills every node and removes the data. */
  async stop(): Promise<void> {
    const exits: Promise<void>[] = [];
    for (const p of this.procs.values()) {
      if (p.exitCode === null && p.signalCode === null) {
        exits.push(new Promise((resolve) => p.once("exit", () => resolve())));
        p.kill("SIGKILL");
      }
    }
    await Promise.race([Promise.all(exits), new Promise((r) => setTimeout(r, 5_000))]);
    this.procs.clear();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}
