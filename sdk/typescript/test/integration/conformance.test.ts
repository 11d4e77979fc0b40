// Runs every scenario of the shared conformance file (sdk/conformance/scenarios.json) against
// a real 3-node cluster: client scenarios through this SDK, HTTP scenarios through the Express
// middleware under Express 5 and Express 4 (each run with fresh placeholders), in file order.

import { after, before, describe, test } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import express = require("express");

import { Cluster, repoRoot } from "../support/cluster";
import { runScenario, type Framework, type ScenarioFile } from "../support/conformance";
import { seeded, withSeed } from "../support/random";

// eslint-disable-next-line @typescript-eslint/no-require-imports
const express4: typeof express = require("express4");

const FILE = path.join(repoRoot(), "sdk", "conformance", "scenarios.json");
const file: ScenarioFile = JSON.parse(fs.readFileSync(FILE, "utf8"));
const frameworks: Array<[string, Framework]> = [
  ["express 5", express as unknown as Framework],
  ["express 4", express4 as unknown as Framework],
];
const rnd = seeded();

describe("conformance scenarios", () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.start();
  });
  after(async () => {
    await cluster?.stop();
  });

  test("the file is one this runner understands", () => {
    assert.equal(file.version, 1);
    assert.ok(file.scenarios.length > 0);
    const names = new Set(file.scenarios.map((s) => s.name));
    assert.equal(names.size, file.scenarios.length, "scenario names are unique");
    for (const s of file.scenarios) assert.ok(s.kind === "client" || s.kind === "http", `${s.name}: kind ${s.kind}`);
  });

  for (const scenario of file.scenarios) {
    const runs: Array<[string, Framework | null]> = scenario.kind === "http" ? frameworks.map(([n, f]) => [` [${n}]`, f]) : [["", null]];
    for (const [suffix, framework] of runs) {
      test(`${scenario.name}${suffix}`, async () => {
        await withSeed(rnd, () => runScenario({ file, cluster, rnd }, scenario, framework));
      });
    }
  }
});
