#!/usr/bin/env node
// node hosts/js/replay.mjs TRACE... --component FILE [--swap-component NAME=FILE]... [--json] [--all-divergences]
//
// Replays traces (docs/traces.md) through a component and compares every result with the recorded
// one. Exit 0: every result is identical; 1: a result differs; 2: a trace cannot be read or
// replayed (`FILE:LINE: why` on stderr), or a component cannot be loaded.

import { loadSchema } from './codec.mjs';
import { LoadError, loadComponentFile } from './loader.mjs';
import { ReplayError, byteOrder, replayTrace } from './replayer.mjs';

const USAGE = 'usage: node hosts/js/replay.mjs TRACE... --component FILE [--swap-component NAME=FILE]... [--json] [--all-divergences]';

function parseArgs(argv) {
  const o = { traces: [], component: null, swaps: [], json: false, all: false };
  for (let i = 0; i < argv.length; i++) {
    let a = argv[i];
    let val = null;
    const eq = a.startsWith('--') ? a.indexOf('=') : -1;
    if (eq > 0) {
      val = a.slice(eq + 1);
      a = a.slice(0, eq);
    }
    const value = () => {
      if (val !== null) return val;
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case '--component':
        o.component = value();
        break;
      case '--swap-component': {
        const v = value();
        const k = v.indexOf('=');
        if (k <= 0 || k === v.length - 1) throw new Error(`--swap-component takes NAME=FILE, got ${JSON.stringify(v)}`);
        o.swaps.push([v.slice(0, k), v.slice(k + 1)]);
        break;
      }
      case '--json':
        o.json = true;
        break;
      case '--all-divergences':
        o.all = true;
        break;
      case '--help':
      case '-h':
        process.stdout.write(USAGE + '\n');
        process.exit(0);
        break;
      case '--':
        o.traces.push(...argv.slice(i + 1));
        i = argv.length;
        break;
      default:
        if (a.startsWith('-') && a !== '-') throw new Error(`unknown option ${a}`);
        o.traces.push(argv[i]);
    }
  }
  if (o.traces.length === 0) throw new Error('no trace given');
  if (!o.component) throw new Error('--component FILE is required (this host has no built-in component)');
  return o;
}

// The report is written once every trace is replayed: a run that ends in exit 2 prints nothing on
// stdout (as clb-host), only `FILE:LINE: why` on stderr.
const report = [];
function out(s) {
  report.push(s);
}
function flush() {
  return new Promise((resolve) => {
    const text = report.join('');
    report.length = 0;
    if (!text) return resolve();
    process.stdout.write(text, () => resolve());
  });
}

function divergenceText(file, d) {
  const j = JSON.stringify;
  return `${file}:${d.line}: seq ${d.seq}: ${d.call} differs\n  args: ${j(d.args)}\n  recorded: ${j(d.recorded)}\n  replayed: ${j(d.replayed)}\n`;
}

async function main(argv) {
  let o;
  try {
    o = parseArgs(argv);
  } catch (e) {
    process.stderr.write(`${e.message}\n${USAGE}\n`);
    return 2;
  }
  let schema;
  try {
    schema = loadSchema(process.env.CLB_SCHEMA || undefined);
  } catch (e) {
    process.stderr.write(`${e.message}\n`);
    return 2;
  }
  const load = async (path) => {
    try {
      return await loadComponentFile(path, { schema, maxMemoryBytes: envBytes('CLB_MAX_MEMORY_BYTES', 512 << 20), log: guestLog(path) });
    } catch (e) {
      const why = e instanceof LoadError ? e.message : `cannot load the component: ${e && e.message ? e.message : e}`;
      throw new LoadError(`${path}: ${why}`);
    }
  };
  let component;
  const swapComponents = new Map();
  try {
    component = await load(o.component);
    for (const [name, path] of o.swaps) swapComponents.set(name, await load(path));
  } catch (e) {
    process.stderr.write(`${e.message}\n`);
    return 2;
  }

  const env = { schema, component, swapComponents };
  const results = [];
  const byKind = new Map();
  let identical = true;
  for (const file of o.traces) {
    let res;
    try {
      res = await replayTrace(file, env, {
        allDivergences: o.all,
        onDivergence: o.json ? undefined : (d) => out(divergenceText(file, d)),
      });
    } catch (e) {
      if (e instanceof ReplayError) {
        process.stderr.write(`${file}:${e.line}: ${e.why}\n`);
        return 2;
      }
      throw e;
    }
    results.push(res);
    for (const d of res.divergences) for (const k of d.kinds) byKind.set(k, (byKind.get(k) ?? 0) + 1);
    if (res.divergences.length) identical = false;
    if (!o.json) {
      const k = res.divergences.length;
      out(`${file}: ${res.calls} calls, ${k === 0 ? 'identical' : `${k} divergences`}\n`);
    }
  }
  const kinds = [...byKind.keys()].sort(byteOrder);
  if (o.json) {
    const doc = {
      traces: results.map((r) => ({
        file: r.file,
        calls: r.calls,
        divergences: r.divergences.map((d) => ({ line: d.line, seq: d.seq, call: d.call, args: d.args, recorded: d.recorded, replayed: d.replayed })),
      })),
      identical,
    };
    if (o.all) doc['by-kind'] = Object.fromEntries(kinds.map((k) => [k, byKind.get(k)]));
    out(JSON.stringify(doc) + '\n');
  } else if (o.all) {
    out(`by kind: ${kinds.map((k) => `${k}=${byKind.get(k)}`).join(', ')}\n`);
  }
  await flush();
  return identical ? 0 : 1;
}

// CLB_LOG=debug|info|warn|error prints the guest's diagnostics.log at that level and above on
// stderr; unset, they are dropped (they are not part of the comparison).
const LEVELS = ['debug', 'info', 'warn', 'error'];
function guestLog(path) {
  const min = LEVELS.indexOf(process.env.CLB_LOG ?? '');
  if (min < 0) return undefined;
  return (level, message) => {
    if (LEVELS.indexOf(level) >= min) process.stderr.write(`[${path}] ${level}: ${message}\n`);
  };
}

function envBytes(name, dflt) {
  const v = process.env[name];
  if (v === undefined || v === '') return dflt;
  const n = Number(v);
  return Number.isSafeInteger(n) && n >= 0 ? n : dflt;
}

const code = await main(process.argv.slice(2));
// Let stdout drain before exiting with the code.
process.exitCode = code;
