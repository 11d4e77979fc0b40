// Seeded randomness for tests: every random choice a test makes comes from one seed, printed
// with any failure, so a failing run can be repeated with IDEMRAFT_TEST_SEED=<seed>.

import { randomInt } from "node:crypto";

export interface Seeded {
  seed: number;
  /** Uniform in [0, 1). */
  random: () => number;
  /** Uniform integer in [lo, hi]. */
  int: (lo: number, hi: number) => number;
  /** `n` random lowercase hex characters. */
  hex: (n: number) => string;
}

/** mulberry32: small, fast, and good enough to spread test choices. */
export function seeded(seed: number = Number(process.env.IDEMRAFT_TEST_SEED ?? randomInt(0, 2 ** 31))): Seeded {
  let a = seed >>> 0;
  const random = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    seed,
    random,
    int: (lo, hi) => lo + Math.floor(random() * (hi - lo + 1)),
    hex: (n) => Array.from({ length: n }, () => Math.floor(random() * 16).toString(16)).join(""),
  };
}

/** Runs `fn`; a failure is rethrown naming the seed that reproduces it. */
export async function withSeed<T>(s: Seeded, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    const err = e instanceof Error ? e : new Error(String(e));
    err.message = `${err.message}\n(random seed ${s.seed}: rerun with IDEMRAFT_TEST_SEED=${s.seed})`;
    throw err;
  }
}
