// A bounded line reader for JSON Lines: it never holds more than one line of at most `limit`
// bytes (plus one read buffer), and refuses a longer line as soon as it has read past the limit.

import { closeSync, openSync, readSync } from 'node:fs';

/** docs/traces.md "Limits": readers refuse a line over 64 MiB. */
export const LINE_LIMIT = 64 * 1024 * 1024;

/** A line that cannot be read: `FILE:LINE: why`. */
export class LineError extends Error {
  /** @param {number} line 1-based @param {string} why */
  constructor(line, why) {
    super(why);
    this.name = 'LineError';
    this.line = line;
    this.why = why;
  }
}

const decoder = new TextDecoder('utf-8', { fatal: true });

/**
 * Yields the lines of a file, 1-based, without their `\n`. Every line ends in `\n`: a last line
 * without one is a truncated trace (LineError), as for clb-host. An empty file yields nothing.
 * Throws LineError for a line over `limit` bytes or not UTF-8.
 * @param {string} path
 * @param {{limit?: number, chunk?: number}} [opts]
 * @returns {Generator<{line: number, text: string}>}
 */
export function* readLines(path, opts = {}) {
  const limit = opts.limit ?? LINE_LIMIT;
  const chunkSize = opts.chunk ?? 1 << 20;
  const fd = openSync(path, 'r');
  try {
    const buf = Buffer.allocUnsafe(chunkSize);
    /** @type {Buffer[]} */
    let parts = [];
    let partsLen = 0;
    let line = 1;
    const take = (last) => {
      const bytes = parts.length === 1 ? parts[0] : Buffer.concat(parts, partsLen);
      parts = [];
      partsLen = 0;
      let text;
      try {
        text = decoder.decode(bytes);
      } catch {
        throw new LineError(line, 'not UTF-8');
      }
      return text;
    };
    for (;;) {
      const n = readSync(fd, buf, 0, chunkSize, null);
      if (n === 0) break;
      let start = 0;
      while (start < n) {
        const nl = buf.indexOf(10, start);
        const end = nl === -1 || nl >= n ? n : nl;
        const len = end - start;
        if (partsLen + len > limit) throw new LineError(line, `line over ${limit === LINE_LIMIT ? '64 MiB' : `${limit} bytes`}`);
        if (len > 0) {
          // Copy: `buf` is reused by the next read.
          parts.push(Buffer.from(buf.subarray(start, end)));
          partsLen += len;
        }
        if (nl === -1 || nl >= n) break;
        const text = take();
        yield { line, text };
        line++;
        start = nl + 1;
      }
    }
    if (partsLen > 0) throw new LineError(line, 'the last line has no newline: the trace is truncated');
  } finally {
    closeSync(fd);
  }
}
