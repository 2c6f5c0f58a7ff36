// The canonical encoding (docs/traces.md "Values"), strict decoding, against the schema file.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CodecError, camel, compileType, loadSchema } from '../codec.mjs';

const schema = loadSchema();
const fn = (call) => schema.get(call);
const param = (call, name) => fn(call).params.find((p) => p.name === name).codec;
const ctx = { handleIn: (_r, n) => n, handleOut: (_r, n) => n };
const roundTrip = (codec, json) => JSON.stringify(codec.encode(codec.decode(json, '', ctx), ctx, ''));

test('the schema describes the world', () => {
  assert.equal(schema.package, 'clb:reconciler@0.14.0');
  for (const call of ['validate-config', 'admit-service', 'tracker.create', 'tracker.observe', 'tracker.complete', 'tracker.tick', 'tracker.import-state', 'tracker.export-state', 'tracker.state-version', 'tracker.stats', 'place-service', 'pool-queue.create', 'pool-queue.enqueue', 'pool-queue.remove-operations', 'pool-queue.status', 'pool-queue.drain-and-group', 'pool-queue.report']) {
    assert.ok(fn(call), call);
  }
  assert.ok(fn('tracker.observe').returnsStep);
  assert.ok(fn('tracker.create').returnsOwn && fn('tracker.create').resultIsResult);
  assert.equal(fn('tracker.observe').kind, 'method');
  assert.equal(fn('tracker.import-state').member, 'importState');
});

test('jco names: camelCase fields', () => {
  assert.equal(camel('wake-at-ms'), 'wakeAtMs');
  assert.equal(camel('ipv4'), 'ipv4');
  assert.equal(camel('internal-ips'), 'internalIps');
});

test('canonical text round-trips', () => {
  const batch = param('tracker.observe', 'batch');
  const text = '[{"tag":"node-upserted","val":{"name":"n/1 é \\" \\\\ \\n \\u0001","internal-ips":["10.0.0.4"]}},{"tag":"lists-complete"},{"tag":"service-deleted","val":["shop","web"]}]';
  assert.equal(roundTrip(batch, JSON.parse(text)), text);
  const js = batch.decode(JSON.parse(text), '', ctx);
  assert.deepEqual(js[0], { tag: 'node-upserted', val: { name: 'n/1 é " \\ \n \u0001', internalIps: ['10.0.0.4'] } });
  assert.deepEqual(js[1], { tag: 'lists-complete' });
  const state = param('tracker.import-state', 'state');
  const s = state.decode({ version: 3, payload: 'AQID' }, '', ctx);
  assert.ok(s.payload instanceof Uint8Array);
  assert.deepEqual([...s.payload], [1, 2, 3]);
  assert.equal(roundTrip(state, { version: 3, payload: '' }), '{"version":3,"payload":""}');
  const results = param('tracker.complete', 'results');
  const r = results.decode([['18446744073709551615', { tag: 'failed', val: { status: 0, code: null, 'retry-after-ms': '0', message: '' } }]], '', ctx);
  assert.equal(r[0][0], 18446744073709551615n);
  assert.equal(r[0][1].val.code, undefined);
  assert.equal(r[0][1].val.retryAfterMs, 0n);
});

test('results of exported functions: ok/err', () => {
  const res = fn('validate-config').result;
  assert.equal(JSON.stringify(res.encode({ tag: 'ok', val: 'inactive' })), '{"tag":"ok","val":"inactive"}');
  assert.equal(JSON.stringify(res.encode({ tag: 'err', val: { field: 'f', reason: 'r', message: 'm' } })), '{"tag":"err","val":{"field":"f","reason":"r","message":"m"}}');
  const own = fn('tracker.create').result;
  assert.equal(JSON.stringify(own.encode({ tag: 'ok', val: {} }, { handleOut: () => 4 })), '{"tag":"ok","val":4}');
  const placed = fn('place-service').result;
  assert.equal(JSON.stringify(placed.encode({ tag: 'not-local', val: [] })), '{"tag":"not-local","val":[]}');
  const left = { tag: 'not-local', val: [{ loadBalancer: 'lb1', pool: 'shop-web' }] };
  assert.equal(JSON.stringify(placed.encode(left)), '{"tag":"not-local","val":[{"load-balancer":"lb1","pool":"shop-web"}]}');
  assert.equal(JSON.stringify(placed.encode({ tag: 'refused', val: 'why' })), '{"tag":"refused","val":"why"}');
});

test('decoding is strict', () => {
  const bad = (codec, json, re) => assert.throws(() => codec.decode(json, 'x', ctx), (e) => e instanceof CodecError && re.test(e.message), JSON.stringify(json));
  const nowMs = param('tracker.observe', 'now-ms');
  for (const v of ['01', '-1', '+1', '1.0', ' 1', '', '18446744073709551616', 1, null]) bad(nowMs, v, /u64|range/);
  assert.equal(nowMs.decode('0'), 0n);
  const batch = param('tracker.observe', 'batch');
  bad(batch, [{ tag: 'node-upserted', val: { name: 'n', 'internal-ips': [], extra: 1 } }], /unknown field "extra"/);
  bad(batch, [{ tag: 'node-upserted', val: { name: 'n' } }], /missing field "internal-ips"/);
  bad(batch, [{ tag: 'node-moved' }], /unknown case/);
  bad(batch, [{ tag: 'lists-complete', val: null }], /no payload/);
  bad(batch, [{ tag: 'node-deleted' }], /needs a "val"/);
  bad(batch, [{ tag: 'node-deleted', val: 'n', x: 1 }], /unknown key/);
  bad(batch, [{ tag: 'service-deleted', val: ['a'] }], /tuple of 2/);
  bad(batch, [{ tag: 'node-deleted', val: '\ud800' }], /surrogate/);
  const state = param('tracker.import-state', 'state');
  for (const p of ['AQI', 'AQI=A', 'AQJ=', 'A-I=', 'AQ==\n']) bad(state, { version: 1, payload: p }, /base64/);
  bad(state, { version: -1, payload: '' }, /range/);
  bad(state, { version: 4294967296, payload: '' }, /range/);
  bad(state, { version: 1.5, payload: '' }, /u32/);
  const maxRetries = param('pool-queue.create', 'max-retries');
  bad(maxRetries, '3', /u32/);
  const group = param('pool-queue.report', 'outcome');
  bad(group, { tag: 'failed', val: { status: 70000, code: null, 'retry-after-ms': null, message: '' } }, /range for u16/);
});

test('loose decoding (the API) takes bigint, numbers, bytes and left-out options', () => {
  const loose = loadSchema(undefined, { loose: true });
  const c = loose.get('tracker.complete').params.find((p) => p.name === 'results').codec;
  const v = c.decode([[5, { tag: 'failed', val: { status: 500, message: 'x' } }], [6n, { tag: 'ok' }]], '', null);
  assert.equal(v[0][0], 5n);
  assert.equal(v[1][0], 6n);
  assert.equal(v[0][1].val.code, undefined);
  assert.throws(() => c.decode([[1.5, { tag: 'ok' }]], '', null), CodecError);
});

test('the schema refuses types without a canonical encoding', () => {
  for (const t of ['f32', 'char', { flags: ['a'] }, { option: { option: 'u8' } }]) assert.throws(() => compileType(t), CodecError);
});

test('a list of u64 that jco lifts as a BigUint64Array encodes as decimal strings', () => {
  const counts = compileType({ list: 'u64' });
  assert.deepEqual(counts.encode(new BigUint64Array([0n, 18446744073709551615n]), ctx, ''), ['0', '18446744073709551615']);
  assert.deepEqual(compileType({ list: 'u32' }).encode(new Uint32Array([7]), ctx, ''), [7]);
  assert.throws(() => counts.encode(new DataView(new ArrayBuffer(8)), ctx, ''), CodecError);
});
