// The bounded line reader.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { LineError, readLines } from '../lines.mjs';

const dir = mkdtempSync(join(tmpdir(), 'clb-lines-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const file = (name, content) => {
  const p = join(dir, name);
  writeFileSync(p, content);
  return p;
};

test('lines, across read chunks', () => {
  const p = file('a', 'one\ntwo é\n\nfour\n');
  assert.deepEqual([...readLines(p, { chunk: 3 })].map((l) => [l.line, l.text]), [[1, 'one'], [2, 'two é'], [3, ''], [4, 'four']]);
  assert.deepEqual([...readLines(file('empty', ''))], []);
});

test('a last line without a newline is a truncated trace', () => {
  const p = file('b', 'one\ntw');
  assert.throws(() => [...readLines(p)], (e) => e instanceof LineError && e.line === 2 && /truncated/.test(e.why));
});

test('a line over the limit is refused before it is read whole', () => {
  const p = file('c', 'ok\n' + 'x'.repeat(100) + '\n');
  assert.deepEqual([...readLines(p, { limit: 100, chunk: 7 })].map((l) => l.text.length), [2, 100]);
  const q = file('d', 'ok\n' + 'x'.repeat(101) + '\n');
  assert.throws(() => [...readLines(q, { limit: 100, chunk: 7 })], (e) => e instanceof LineError && e.line === 2 && /over/.test(e.why));
});

test('not UTF-8', () => {
  const p = file('e', Buffer.from([0x7b, 0xff, 0x7d, 0x0a]));
  assert.throws(() => [...readLines(p)], (e) => e instanceof LineError && /UTF-8/.test(e.why));
});
