// The integrator API against the component: re-making every call of each golden trace through
// callByName, recording a trace, gives the golden trace's lines byte for byte (the header aside).
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { callByName, CodecError, loadComponent } from '../index.mjs';

const here = fileURLToPath(new URL('.', import.meta.url));
const tracesDir = join(here, '..', '..', '..', 'tests', 'traces');
const component = process.env.CLB_COMPONENT || '/tmp/clb-artifacts/clb_guest.wasm';
const have = existsSync(component) && existsSync(tracesDir);
const config = { 'backend-pool-type': 'podIP', 'load-balancer-sku': 'standardV2', 'multiple-standard-load-balancers': [], 'write-budgets': null };

test('recording through the API reproduces the golden traces', { skip: !have }, async () => {
  const files = readdirSync(tracesDir).filter((f) => f.endsWith('.jsonl')).sort();
  let checked = 0;
  for (const f of files) {
    const lines = readFileSync(join(tracesDir, f), 'utf8').trimEnd().split('\n');
    const calls = lines.slice(1).map((l) => JSON.parse(l));
    if (calls.some((c) => ['swap', 'rollback', 'rebuild'].includes(c.call) || 'trap' in c)) continue;
    const out = [];
    const clb = await loadComponent(component, { record: (line) => out.push(line) });
    const handles = new Map();
    for (const c of calls) {
      const args = { ...c.args };
      if ('self' in args) args.self = handles.get(args.self);
      let r = callByName(clb, c.call, args);
      if (r instanceof Promise) r = await r;
      if (c.call.endsWith('.create') || c.call === 'tracker.import-state') {
        const h = r && r.tag ? r.val : r;
        if (h && typeof h === 'object') handles.set(h.handle, h);
      }
    }
    assert.deepEqual(out.slice(1), lines.slice(1), f);
    checked++;
  }
  assert.ok(checked > 10);
});

test('values in, values out', { skip: !existsSync(component) }, async () => {
  const clb = await loadComponent(component);
  assert.deepEqual(clb.validateConfig(config), { tag: 'ok', val: 'container-load-balancer' });
  assert.equal(clb.validateConfig({ ...config, 'backend-pool-type': 'x' }).tag, 'err');
  assert.throws(() => clb.validateConfig({ ...config, extra: 1 }), CodecError);
  const created = await clb.Tracker.create(config);
  assert.equal(created.tag, 'ok');
  const tracker = created.val;
  const step = tracker.observe(5n, [{ tag: 'lists-complete' }]);
  assert.deepEqual(step, { commands: [{ id: '0', command: { tag: 'read-nrp' } }], 'wake-at-ms': null, idle: false });
  const after = tracker.complete('6', [[0, { tag: 'nrp-snapshot', val: { services: [], locations: [] } }]]);
  assert.equal(typeof after.idle, 'boolean');
  const state = tracker.exportState();
  assert.equal(typeof state.payload, 'string');
  assert.equal(state.version, tracker.stateVersion());
  const copy = await clb.Tracker.importState(config, state);
  assert.equal(copy.tag, 'ok');
  assert.deepEqual(copy.val.exportState(), state);
  const bad = await clb.Tracker.importState(config, { version: 999, payload: '' });
  assert.deepEqual(bad, { tag: 'err', val: { tag: 'unsupported-version', val: 999 } });
  tracker.checkpoint();
  tracker.rebuild();
  assert.deepEqual(tracker.exportState(), state);
  const q = await clb.PoolQueue.create(2);
  q.enqueue([{ service: 'shop/web', 'load-balancer': 'lb1', pool: 'shop-web', kind: 'add', 'node-ips': ['10.0.0.4'] }]);
  assert.equal(q.status(1).queued, 1);
  const groups = q.drainAndGroup(2, [{ service: 'shop/web', 'load-balancer': 'lb1' }]);
  assert.equal(groups.length, 1);
  assert.equal(q.report(3, groups[0].id, { tag: 'updated' }).disposition, 'done');
  assert.equal(q.report(3, groups[0].id, { tag: 'updated' }), null);
});

const next = process.env.CLB_NEXT_COMPONENT || '/tmp/clb-artifacts/next_guest.wasm';

test('swap and rollback through the API, recorded, replay identically', { skip: !existsSync(component) || !existsSync(next) }, async (t) => {
  const { mkdtempSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { spawnSync } = await import('node:child_process');
  const dir = mkdtempSync(join(tmpdir(), 'clb-api-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const trace = join(dir, 'swap.jsonl');
  const clb = await loadComponent(component, { record: trace, source: 'test' });
  const candidate = await loadComponent(next);
  // The built-in version's state schema, read from an instance the trace does not record.
  const plain = await loadComponent(component);
  const builtinVersion = (await plain.Tracker.create(config)).val.stateVersion();
  await plain.close();
  const tracker = (await clb.Tracker.create(config)).val;
  tracker.observe(0, [{ tag: 'lists-complete' }]);
  tracker.complete(1, [[0, { tag: 'nrp-snapshot', val: { services: [], locations: [] } }]]);
  const swapped = await tracker.swap(candidate, { name: 'next-guest' });
  assert.equal(swapped.tag, 'ok');
  const svc = { uid: 'u-1', namespace: 'shop', name: 'web', 'service-type': 'LoadBalancer', 'external-traffic-policy': 'Local', 'ip-families': ['IPv4'], ports: [{ port: 80 }], annotations: [['clb.test/legacy', 'true']], finalizers: [], deleting: false, 'ingress-ips': [], labels: [] };
  swapped.val.observe(2, [{ tag: 'service-upserted', val: svc }]);
  assert.equal(swapped.val.stateVersion(), builtinVersion + 1);
  assert.throws(() => tracker.tick(2), /was swapped/);
  const back = await swapped.val.rollback();
  back.tick(3);
  await clb.close();
  for (const cmd of [[process.execPath, join(here, '..', 'replay.mjs')]]) {
    const r = spawnSync(cmd[0], [cmd[1], trace, '--component', component, '--swap-component', `next-guest=${next}`], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /: 8 calls, identical\n$/);
  }
});

const uid = '6a1f0c8e-2b3d-4e5f-8a9b-0c1d2e3f4a01';
const service = { uid, namespace: 'shop', name: 'web', 'service-type': 'LoadBalancer', 'external-traffic-policy': 'Local', 'ip-families': [], ports: [{ name: 'http', protocol: 'TCP', port: 80, 'target-port': { tag: 'number', val: 8080 } }], annotations: [], finalizers: [], deleting: false, 'ingress-ips': [], labels: [] };
const slice = { namespace: 'shop', name: 'web-abc12', 'owner-service-uid': uid, 'address-type': 'IPv4', endpoints: [{ addresses: ['10.244.1.10'], 'node-name': 'aks-node-1', ready: true }], deleting: false };

// Start-up (lists complete, NRP and ARM read) with one Service and its endpoints, up to the first
// write of its creation: the flow of the golden trace `a-first-service-with-endpoints-…`.
async function startedWithAServiceBeingCreated(clb) {
  const tracker = (await clb.Tracker.create(config)).val;
  tracker.observe(1000, [{ tag: 'lists-complete' }]);
  tracker.observe(1000, [{ tag: 'node-upserted', val: { name: 'aks-node-1', 'internal-ips': ['10.224.0.4'] } }, { tag: 'service-upserted', val: service }, { tag: 'slice-upserted', val: slice }]);
  tracker.complete(1100, [[0, { tag: 'nrp-snapshot', val: { services: [], locations: [] } }]]);
  tracker.complete(1200, [[1, { tag: 'arm-inventory', val: { 'public-ips': [], 'load-balancers': [], 'nat-gateways': [] } }]]);
  tracker.complete(1300, [[2, { tag: 'ok' }]]);
  return tracker;
}

// The call after the stats: the answer to the public IP the creation asked for.
const answerThePublicIp = (tracker) => tracker.complete(1500, [[3, { tag: 'public-ip-address', val: '20.1.2.3' }]]);
const states = ['not-started', 'creation-in-progress', 'created', 'deletion-pending', 'deletion-in-progress', 'update-in-progress'];

test('stats shows a Service being created as pending inbound among all twelve states, and the three budgets', { skip: !existsSync(component) }, async () => {
  const clb = await loadComponent(component);
  const stats = (await startedWithAServiceBeingCreated(clb)).stats(1400);
  assert.equal(stats['service-gateway-enabled'], true);
  assert.equal(stats.pending.length, 12);
  const key = (p) => `${p.state}/${p['service-type']}`;
  assert.deepEqual(stats.pending.map(key).sort(), states.flatMap((s) => [`${s}/inbound`, `${s}/outbound`]).sort());
  assert.deepEqual(stats.pending.filter((p) => p.count > 0), [{ state: 'creation-in-progress', 'service-type': 'inbound', count: 1, 'oldest-began-ms': '1000' }]);
  assert.equal(stats['k8s-services'], 1);
  assert.deepEqual(stats.budgets.map((b) => b.bucket), ['update-address-locations', 'update-services', 'arm-writes']);
  assert.ok(stats.budgets.every((b) => /^-?\d+$/.test(b.tokens) && b['per-minute'] > 0), JSON.stringify(stats.budgets));
});

test('stats reads only: twice the same answer, and the next step as without it', { skip: !existsSync(component) }, async () => {
  const clb = await loadComponent(component);
  const [asked, unasked] = [await startedWithAServiceBeingCreated(clb), await startedWithAServiceBeingCreated(clb)];
  const first = asked.stats(1400);
  assert.deepEqual(asked.stats(1400), first);
  const after = answerThePublicIp(asked);
  assert.deepEqual(after, answerThePublicIp(unasked));
  assert.ok(after.commands.length > 0, 'the next step does something, so that a change would show');
  assert.deepEqual(asked.exportState(), unasked.exportState());
});

test('a recorded trace with stats calls replays identically, and a changed stats result diverges', { skip: !existsSync(component) }, async (t) => {
  const { mkdtempSync, rmSync, writeFileSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { spawnSync } = await import('node:child_process');
  const lines = [];
  const clb = await loadComponent(component, { record: (line) => lines.push(line), source: 'test' });
  const tracker = await startedWithAServiceBeingCreated(clb);
  tracker.stats(1400);
  tracker.stats(1400);
  answerThePublicIp(tracker);
  await clb.close();
  const i = lines.findIndex((l) => l.includes('"call":"tracker.stats"'));
  assert.ok(i > 0 && lines[i].includes('"k8s-services":1,'), lines[i]);
  const dir = mkdtempSync(join(tmpdir(), 'clb-stats-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const replay = (text) => {
    const trace = join(dir, 'stats.jsonl');
    writeFileSync(trace, text.join('\n') + '\n');
    return spawnSync(process.execPath, [join(here, '..', 'replay.mjs'), trace, '--component', component, '--json', '--all-divergences'], { encoding: 'utf8' });
  };
  let r = replay(lines);
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.equal(JSON.parse(r.stdout).traces[0].calls, lines.length - 1);
  lines[i] = lines[i].replace('"k8s-services":1,', '"k8s-services":2,');
  r = replay(lines);
  assert.equal(r.status, 1, r.stdout + r.stderr);
  assert.deepEqual(JSON.parse(r.stdout).traces[0].divergences.map((d) => [d.seq, d.call]), [[i - 1, 'tracker.stats']]);
});
