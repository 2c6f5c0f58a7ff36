#!/usr/bin/env node
// node hosts/js/bench.mjs COMPONENT [TRACE] [N]: per-call costs through the integrator API, N calls
// each (default 2000).
//
// * admit-service on a Service of the trace;
// * tracker.observe of one EndpointSlice change on a small tracker (the trace's state: one
//   Service, two Nodes, one slice), the slice alternating between its endpoints and one more,
//   each resulting command completed outside the timed call;
// * the same two through the raw jco bindings (no codec), to show what the codec costs.
import { readFileSync } from 'node:fs';
import { callByName, loadComponent } from './index.mjs';

const [componentPath, traceArg, nArg] = process.argv.slice(2);
const tracePath = traceArg || new URL('../../tests/traces/a-first-service-with-endpoints-gets-a-load-balancer-and-its-pods-in-nrp.jsonl', import.meta.url).pathname;
const N = nArg === undefined ? 2000 : Number(nArg);
if (!componentPath || !(Number.isInteger(N) && N > 0)) {
  console.error('usage: node hosts/js/bench.mjs COMPONENT [TRACE] [N]');
  process.exit(2);
}
const clb = await loadComponent(componentPath);
const lines = readFileSync(tracePath, 'utf8').trim().split('\n').slice(1).map((l) => JSON.parse(l));
const handles = new Map();
let config, service, slice;
for (const l of lines) {
  const args = { ...l.args };
  if ('self' in args) args.self = handles.get(args.self);
  let r = callByName(clb, l.call, args);
  if (r instanceof Promise) r = await r;
  if (l.call === 'tracker.create') handles.set(l.result.val, r.val);
  config ??= l.args.config;
  for (const o of l.args.batch ?? []) {
    if (o.tag === 'service-upserted') service = o.val;
    if (o.tag === 'slice-upserted') slice = o.val;
  }
}
const tracker = handles.get(0);

function timeIt(name, n, fn) {
  for (let i = 0; i < Math.min(200, n); i++) fn(i); // warm-up
  const samples = [];
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    fn(i);
    samples.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  samples.sort((a, b) => a - b);
  const q = (p) => samples[Math.floor(p * (samples.length - 1))].toFixed(1);
  console.log(`${name}: median ${q(0.5)} us, p90 ${q(0.9)} us, p99 ${q(0.99)} us (${n} calls)`);
}

timeIt('admit-service (API)', N, () => clb.admitService(config, service));

const extra = structuredClone(slice);
extra.endpoints.push({ addresses: ['10.244.1.99'], 'node-name': extra.endpoints[0]['node-name'], ready: true });
let now = 1000;
let shown = false;
// Each step's commands are completed (ok) between the timed observes, outside the timing.
const samples = [];
const warm = Math.min(200, N);
for (let i = 0; i < N + warm; i++) {
  now += 1;
  const t0 = process.hrtime.bigint();
  const step = tracker.observe(String(now), [{ tag: 'slice-upserted', val: i % 2 ? slice : extra }]);
  const dt = Number(process.hrtime.bigint() - t0) / 1000;
  if (i >= warm) samples.push(dt);
  if (!shown && i === warm) {
    shown = true;
    console.log(`one observe gives: ${JSON.stringify(step).slice(0, 300)}…`);
  }
  if (step.commands.length) tracker.complete(String(now), step.commands.map((c) => [c.id, { tag: 'ok' }]));
}
samples.sort((a, b) => a - b);
const q = (p) => samples[Math.floor(p * (samples.length - 1))].toFixed(1);
console.log(`tracker.observe, one EndpointSlice change (API): median ${q(0.5)} us, p90 ${q(0.9)} us, p99 ${q(0.99)} us (${N} calls)`);
console.log(`tracker memory: ${(tracker.memoryBytes() / 1048576).toFixed(1)} MiB`);

// Raw jco bindings: the codec's share.
const schema = clb.schema;
const admit = schema.get('admit-service');
const jsConfig = admit.params[0].codec.decode(config, '', null);
const jsService = admit.params[1].codec.decode(service, '', null);
const raw = clb.loaded.instantiate().root['clb:reconciler/validation@0.14.0'];
timeIt('admit-service (raw jco, no codec)', N, () => raw.admitService(jsConfig, jsService));
