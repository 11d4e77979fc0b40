// Fake nodes for the client's unit tests: gRPC servers that answer as a real node does under
// faults (no leader, an overloaded leader, a quota refusal, a leader hint), a TCP server whose
// connections break mid-call, as a node killed mid-call does, and one that takes calls and
// never answers, as a paused or partitioned node does.

import * as grpc from "@grpc/grpc-js";
import * as net from "node:net";

import { services } from "../../src/proto";

export interface Seen {
  method: string;
  request: any;
  metadata: grpc.Metadata;
}

type Answer =
  | { ok: any; metadata?: Record<string, string>; delayMs?: number }
  | { code: number; details: string; metadata?: Record<string, string>; delayMs?: number };

/** Decides each call's answer from the method, the request and how many calls came before. */
export type Script = (method: string, request: any, n: number) => Answer;

export interface FakeNode {
  addr: string;
  seen: Seen[];
  stop(): Promise<void>;
}

function md(fields: Record<string, string> | undefined): grpc.Metadata {
  const m = new grpc.Metadata();
  for (const [k, v] of Object.entries(fields ?? {})) m.set(k, v);
  return m;
}

/** A gRPC server with the Idempotency and Admin services, answering by `script`. */
export async function fakeNode(script: Script): Promise<FakeNode> {
  const server = new grpc.Server();
  const seen: Seen[] = [];
  const handlerFor = (method: string) => (call: grpc.ServerUnaryCall<any, any>, cb: grpc.sendUnaryData<any>) => {
    seen.push({ method, request: call.request, metadata: call.metadata });
    const a = script(method, call.request, seen.length - 1);
    const reply = () => {
      if ("ok" in a) {
        if (a.metadata) call.sendMetadata(md(a.metadata));
        cb(null, a.ok);
      } else {
        cb({ code: a.code, details: a.details, metadata: md({ "idemraft-served-by": "9", ...(a.metadata ?? {}) }) });
      }
    };
    if (a.delayMs) setTimeout(reply, a.delayMs);
    else reply();
  };
  const { Idempotency, Admin } = services();
  const impl = (svc: grpc.ServiceClientConstructor) =>
    Object.fromEntries(Object.keys(svc.service).map((m) => [m, handlerFor(m)]));
  server.addService(Idempotency.service, impl(Idempotency));
  server.addService(Admin.service, impl(Admin));
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
  );
  return {
    addr: `127.0.0.1:${port}`,
    seen,
    stop: () => new Promise<void>((resolve) => server.tryShutdown(() => resolve())),
  };
}

/** An empty HTTP/2 SETTINGS frame: the server's half of the handshake. */
const SERVER_PREFACE = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);

/** A fake node that takes calls over raw HTTP/2 frames: see `breakingNode` and `silentNode`. */
export interface RawNode {
  addr: string;
  /** Calls it took (and left unanswered). */
  calls: () => number;
  stop(): Promise<void>;
}

export type BreakingNode = RawNode;
export type SilentNode = RawNode;

/**
 * A node whose connections break mid-call: it answers the HTTP/2 handshake, reads frames until
 * a call's message (a DATA frame) has arrived, and destroys the socket without an answer.
 */
export function breakingNode(): Promise<BreakingNode> {
  return rawNode(0, true);
}

/**
 * A node that stopped (SIGSTOP, a partition that drops packets) after its connection was made:
 * it answers the HTTP/2 handshake, then takes each call (a HEADERS frame opening a stream) and
 * never answers it.
 */
export function silentNode(): Promise<SilentNode> {
  return rawNode(1, false);
}

/**
 * A node that speaks only enough HTTP/2 to take calls: it answers the handshake and reads
 * frames, counting those of type `counted`; with `close`, the first one ends the connection.
 */
async function rawNode(counted: number, close: boolean): Promise<RawNode> {
  let calls = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => undefined);
    socket.write(SERVER_PREFACE);
    let buf = Buffer.alloc(0);
    let at = 24; // after the client's connection preface
    socket.on("data", (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      while (buf.length >= at + 9) {
        const len = (buf[at] << 16) | (buf[at + 1] << 8) | buf[at + 2];
        if (buf[at + 3] === counted) {
          calls++;
          if (close) {
            socket.destroy();
            return;
          }
        }
        at += 9 + len;
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  const a = server.address() as net.AddressInfo;
  return {
    addr: `127.0.0.1:${a.port}`,
    calls: () => calls,
    stop: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A loopback address nothing listens on (connections are refused). */
export async function deadAddr(): Promise<string> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `127.0.0.1:${port}`;
}

/** A wire Outcome: ACQUIRED with this token. */
export function acquired(token: string | number = 7): any {
  return { acquired: { token: String(token), attempt: 1, takeover: false, lease_expires_ms: "1", expires_ms: "2" } };
}
