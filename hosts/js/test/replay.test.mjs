// Replays the golden traces through the component, and checks the exit codes of the contract on
// edited copies. Needs the component: CLB_COMPONENT (default /tmp/clb-artifacts/clb_guest.wasm)
// and, for the hot-swap trace, CLB_NEXT_COMPONENT (default /tmp/clb-artifacts/next_guest.wasm);
// skipped when they are missing.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, openSync, writeSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = fileURLToPath(new URL('.', import.meta.url));
const replay = join(here, '..', 'replay.mjs');
const tracesDir = join(here, '..', '..', '..', 'tests', 'traces');
const component = process.env.CLB_COMPONENT || '/tmp/clb-artifacts/clb_guest.wasm';
const next = process.env.CLB_NEXT_COMPONENT || '/tmp/clb-artifacts/next_guest.wasm';
const have = existsSync(component);
const traces = existsSync(tracesDir) ? readdirSync(tracesDir).filter((f) => f.endsWith('.jsonl')).sort().map((f) => join(tracesDir, f)) : [];
const tmp = mkdtempSync(join(tmpdir(), 'clb-replay-'));
// The long trace alone is tens of megabytes: nothing is left behind.
after(() => rmSync(tmp, { recursive: true, force: true }));

function run(args) {
  const r = spawnSync(process.execPath, [replay, ...args, '--component', component, ...(existsSync(next) ? ['--swap-component', `next-guest=${next}`] : [])], { encoding: 'utf8', maxBuffer: 1 << 28 });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

const simple = traces.find((t) => t.includes('a-first-service-with-endpoints')) ?? traces[0];

test('every golden trace replays identically', { skip: !have || traces.length === 0 || !existsSync(next) }, () => {
  const r = run([...traces, '--json']);
  assert.equal(r.code, 0, r.out + r.err);
  const doc = JSON.parse(r.out);
  assert.equal(doc.identical, true);
  assert.equal(doc.traces.length, traces.length);
});

test('a changed recorded result is exit 1, naming its seq', { skip: !have || !simple }, () => {
  const lines = readFileSync(simple, 'utf8').split('\n');
  const i = lines.findIndex((l) => l.includes('"call":"tracker.observe"') && l.includes('"wake-at-ms"'));
  const rec = JSON.parse(lines[i]);
  rec.result.idle = !rec.result.idle;
  lines[i] = JSON.stringify(rec);
  const p = join(tmp, 'changed.jsonl');
  writeFileSync(p, lines.join('\n'));
  const r = run([p]);
  assert.equal(r.code, 1, r.out + r.err);
  assert.match(r.out, new RegExp(`^${p.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:${i + 1}: seq ${rec.seq}: tracker.observe differs\n  args: `));
  assert.match(r.out, /: \d+ calls, 1 divergences\n$/);
  const j = run([p, '--json', '--all-divergences']);
  assert.equal(j.code, 1);
  const doc = JSON.parse(j.out);
  assert.equal(doc.traces[0].divergences[0].seq, rec.seq);
  assert.deepEqual(Object.keys(doc), ['traces', 'identical', 'by-kind']);
  assert.deepEqual(doc['by-kind'], { step: 1 });
});

test('a truncated or malformed trace is exit 2 with FILE:LINE', { skip: !have || !simple }, () => {
  const text = readFileSync(simple, 'utf8');
  const cut = join(tmp, 'cut.jsonl');
  writeFileSync(cut, text.slice(0, text.indexOf('\n', text.indexOf('\n') + 1) + 40));
  let r = run([cut]);
  assert.equal(r.code, 2);
  assert.equal(r.out, '');
  assert.match(r.err, new RegExp(`${cut.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:3: `));
  const lines = text.split('\n');
  lines[2] = lines[2].replace(/"now-ms":"(\d+)"/, '"now-ms":$1');
  const bad = join(tmp, 'bad-u64.jsonl');
  writeFileSync(bad, lines.join('\n'));
  r = run([bad]);
  assert.equal(r.code, 2);
  assert.match(r.err, /bad-u64\.jsonl:3: args\.now-ms: /);
});

test('a line over 64 MiB is exit 2', { skip: !have || !simple }, () => {
  const p = join(tmp, 'long.jsonl');
  const fd = openSync(p, 'w');
  writeSync(fd, readFileSync(simple, 'utf8').split('\n')[0] + '\n{"seq":0,"call":"');
  const chunk = Buffer.alloc(1 << 20, 'x');
  for (let i = 0; i < 65; i++) writeSync(fd, chunk);
  writeSync(fd, '"}\n');
  closeSync(fd);
  const r = run([p]);
  assert.equal(r.code, 2);
  assert.match(r.err, /long\.jsonl:2: line over 64 MiB/);
});

test('a missing component is exit 2', () => {
  const r = spawnSync(process.execPath, [replay, simple ?? 'x.jsonl', '--component', join(tmp, 'none.wasm')], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /none\.wasm: cannot read the component/);
});
