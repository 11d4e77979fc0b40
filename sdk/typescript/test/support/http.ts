// A real HTTP client and server for the middleware tests: apps are served on a loopback port,
// and requests go out with exactly the header lines given (a repeated name is sent as two
// lines, which fetch would fold into one).

import * as http from "node:http";
import type { AddressInfo } from "node:net";

export interface Sent {
  method: string;
  path: string;
  headers?: Array<[string, string]>;
  body?: Buffer | string;
  timeoutMs?: number;
  /** Send the body in two chunks without a Content-Length (the caller gives transfer-encoding). */
  chunked?: boolean;
}

export interface Received {
  status: number;
  /** Header lines as received, names lower-cased. */
  headers: Array<[string, string]>;
  body: Buffer;
}

export function header(r: Received, name: string): string | undefined {
  return r.headers.find(([n]) => n === name)?.[1];
}

export function bodyText(r: Received): string {
  return r.body.toString("utf8");
}

/** Sends one request on its own connection. */
export function send(base: string, req: Sent): Promise<Received> {
  const url = new URL(req.path, base);
  // Headers given as a list go out as given: Node adds no Host line of its own then.
  const raw: string[] = ["host", url.host];
  for (const [n, v] of req.headers ?? []) raw.push(n, v);
  const body = req.body === undefined ? Buffer.alloc(0) : Buffer.from(req.body);
  if (req.method !== "GET" && req.method !== "HEAD" && !req.chunked) raw.push("content-length", String(body.length));
  return new Promise((resolve, reject) => {
    const r = http.request(
      {
        host: url.hostname,
        port: url.port,
        method: req.method,
        path: req.path,
        headers: raw as unknown as http.OutgoingHttpHeaders,
        agent: false,
        timeout: req.timeoutMs ?? 30_000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const headers: Array<[string, string]> = [];
          for (let i = 0; i + 1 < res.rawHeaders.length; i += 2) headers.push([res.rawHeaders[i].toLowerCase(), res.rawHeaders[i + 1]]);
          resolve({ status: res.statusCode ?? 0, headers, body: Buffer.concat(chunks) });
        });
        res.on("error", reject);
      },
    );
    r.on("timeout", () => r.destroy(new Error(`no answer within ${req.timeoutMs ?? 30_000} ms`)));
    r.on("error", reject);
    if (req.chunked) {
      r.write(body.subarray(0, Math.floor(body.length / 2)));
      setTimeout(() => r.end(body.subarray(Math.floor(body.length / 2))), 20);
    } else {
      r.end(body);
    }
  });
}

export interface Served {
  base: string;
  close(): Promise<void>;
}

/** Serves a request listener (an Express app) on a free loopback port. */
export async function serve(app: http.RequestListener): Promise<Served> {
  const server = http.createServer(app);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  const port = (server.address() as AddressInfo).port;
  return {
    base: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
