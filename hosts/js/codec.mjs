// The canonical JSON encoding of WIT values (docs/traces.md, "Values"), driven by the schema file
// `hosts/schema/clb-reconciler.json` (docs/traces.md, "The schema").
//
// Three representations meet here:
//   * JSON text: what a trace line holds;
//   * canonical JSON values: what `JSON.parse` of that text gives (kebab-case keys, u64 as decimal
//     strings, list<u8> as base64 strings, option as `null`, variants and results as {tag, val});
//     `JSON.stringify` of a value built by `encode` is its canonical text, because keys are inserted
//     in the canonical order and no key is integer-like;
//   * jco values: what the bindings jco generates take and give (camelCase record fields, BigInt
//     for u64/s64, Uint8Array for list<u8> (and a typed array for a list of other numbers:
//     BigUint64Array for list<u64>), `undefined` for `none`, {tag, val} variants, string
//     enums, resource objects for own/borrow, and results of exported functions as a return value
//     or a thrown `ComponentError` whose `payload` is the err value).
//
// `decode` (canonical JSON value -> jco value) is strict: a missing or unknown record field, an
// unknown case, a number out of range, a u64 that is not a plain decimal string, bad base64, a
// string that is not well-formed Unicode are errors (`CodecError`, with the path of the value).
// `encode` (jco value -> canonical JSON value) is what a host writes.

import { existsSync, readFileSync } from 'node:fs';

/** An argument or result that does not decode (or a jco value that does not encode). */
export class CodecError extends Error {
  /** @param {string} path where in the value @param {string} why */
  constructor(path, why) {
    super(path ? `${path}: ${why}` : why);
    this.name = 'CodecError';
    this.path = path;
    this.why = why;
  }
}

/** kebab-case -> lowerCamelCase, as jco names record fields, functions and methods. */
export function camel(name) {
  const words = name.split('-');
  return words[0] + words.slice(1).map((w) => (w ? w[0].toUpperCase() + w.slice(1) : '')).join('');
}

/** kebab-case -> UpperCamelCase, as jco names resource classes. */
export function pascal(name) {
  const c = camel(name);
  return c ? c[0].toUpperCase() + c.slice(1) : c;
}

const INT_RANGES = {
  u8: [0, 0xff],
  u16: [0, 0xffff],
  u32: [0, 0xffffffff],
  s8: [-0x80, 0x7f],
  s16: [-0x8000, 0x7fff],
  s32: [-0x80000000, 0x7fffffff],
};
const U64_MAX = (1n << 64n) - 1n;
const S64_MIN = -(1n << 63n);
const S64_MAX = (1n << 63n) - 1n;
const U64_RE = /^(?:0|[1-9][0-9]*)$/;
const S64_RE = /^(?:0|-?[1-9][0-9]*)$/;
const BASE64_RE = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

function describe(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  if (typeof v === 'string') return `the string ${JSON.stringify(v.length > 40 ? v.slice(0, 40) + '…' : v)}`;
  if (typeof v === 'object') return 'an object';
  return `${typeof v} ${String(v)}`;
}

function isPlainObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

const sub = (path, key) => (typeof key === 'number' ? `${path}[${key}]` : path ? `${path}.${key}` : key);

/**
 * A compiled type: `decode(json, path, ctx)` gives the jco value, `encode(js, ctx)` the canonical
 * JSON value. `ctx` resolves resources: `ctx.handleIn(resource, handle, 'own'|'borrow', path)`
 * gives what jco takes for a handle number, `ctx.handleOut(resource, object, path)` what the JSON
 * holds for a resource jco returned. `loose` (the integrator API only, never replay) also takes
 * bigint/safe-integer numbers for u64/s64 and Uint8Array for list<u8>.
 * @typedef {{decode:(json:any,path:string,ctx:any)=>any, encode:(js:any,ctx:any,path?:string)=>any, type:any}} Codec
 */

/**
 * Compiles a schema type into a codec.
 * @param {any} type a type as the schema writes it
 * @param {{loose?: boolean}} [opts]
 * @returns {Codec}
 */
export function compileType(type, opts = {}) {
  const loose = !!opts.loose;
  const c = compileInner(type, loose, '');
  return c;
}

function compileInner(type, loose, where) {
  if (typeof type === 'string') {
    if (type === 'bool') {
      return {
        type,
        decode(j, p) {
          if (typeof j !== 'boolean') throw new CodecError(p, `expected bool, got ${describe(j)}`);
          return j;
        },
        encode(v, _c, p) {
          if (typeof v !== 'boolean') throw new CodecError(p, `expected bool from the component, got ${describe(v)}`);
          return v;
        },
      };
    }
    if (type in INT_RANGES) {
      const [lo, hi] = INT_RANGES[type];
      return {
        type,
        decode(j, p) {
          if (typeof j !== 'number' || !Number.isInteger(j)) throw new CodecError(p, `expected ${type}, got ${describe(j)}`);
          if (j < lo || j > hi) throw new CodecError(p, `${j} is out of range for ${type}`);
          return j === 0 ? 0 : j; // no -0
        },
        encode(v, _c, p) {
          if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi)
            throw new CodecError(p, `expected ${type} from the component, got ${describe(v)}`);
          return v === 0 ? 0 : v;
        },
      };
    }
    if (type === 'u64' || type === 's64') {
      const re = type === 'u64' ? U64_RE : S64_RE;
      const min = type === 'u64' ? 0n : S64_MIN;
      const max = type === 'u64' ? U64_MAX : S64_MAX;
      return {
        type,
        decode(j, p) {
          let b;
          if (typeof j === 'string') {
            if (!re.test(j)) throw new CodecError(p, `expected ${type} as a plain decimal string, got ${describe(j)}`);
            b = BigInt(j);
          } else if (loose && typeof j === 'bigint') {
            b = j;
          } else if (loose && typeof j === 'number' && Number.isSafeInteger(j)) {
            b = BigInt(j);
          } else {
            throw new CodecError(p, `expected ${type} as a decimal string, got ${describe(j)}`);
          }
          if (b < min || b > max) throw new CodecError(p, `${j} is out of range for ${type}`);
          return b;
        },
        encode(v, _c, p) {
          if (typeof v !== 'bigint' || v < min || v > max) throw new CodecError(p, `expected ${type} (bigint) from the component, got ${describe(v)}`);
          return v.toString();
        },
      };
    }
    if (type === 'string') {
      return {
        type,
        decode(j, p) {
          if (typeof j !== 'string') throw new CodecError(p, `expected string, got ${describe(j)}`);
          if (!j.isWellFormed()) throw new CodecError(p, 'string holds a lone surrogate (not Unicode text)');
          return j;
        },
        encode(v, _c, p) {
          if (typeof v !== 'string') throw new CodecError(p, `expected string from the component, got ${describe(v)}`);
          return v;
        },
      };
    }
    throw new CodecError(where, `the schema uses type ${JSON.stringify(type)}, which this host does not know (floats, char and flags are not part of the world)`);
  }
  if (!isPlainObject(type)) throw new CodecError(where, `bad schema type ${describe(type)}`);
  const keys = Object.keys(type);
  if (keys.length !== 1) throw new CodecError(where, `bad schema type with keys ${keys.join(',')}`);
  const kind = keys[0];
  const arg = type[kind];
  switch (kind) {
    case 'list': {
      if (arg === 'u8') return bytesCodec(type, loose);
      const el = compileInner(arg, loose, where + '[]');
      return {
        type,
        decode(j, p, ctx) {
          if (!Array.isArray(j)) throw new CodecError(p, `expected a list (array), got ${describe(j)}`);
          const out = new Array(j.length);
          for (let i = 0; i < j.length; i++) out[i] = el.decode(j[i], sub(p, i), ctx);
          return out;
        },
        encode(v, ctx, p) {
          // jco lifts a list of numbers other than u8 as a typed array (list<u64>: BigUint64Array).
          if (!Array.isArray(v) && !(ArrayBuffer.isView(v) && !(v instanceof DataView))) throw new CodecError(p, `expected a list from the component, got ${describe(v)}`);
          const out = new Array(v.length);
          for (let i = 0; i < v.length; i++) out[i] = el.encode(v[i], ctx, sub(p, i));
          return out;
        },
      };
    }
    case 'option': {
      if (isPlainObject(arg) && 'option' in arg) throw new CodecError(where, 'nested option<option<…>> has no canonical encoding');
      const el = compileInner(arg, loose, where + '?');
      return {
        type,
        decode(j, p, ctx) {
          if (j === null) return undefined;
          if (loose && j === undefined) return undefined;
          return el.decode(j, p, ctx);
        },
        encode(v, ctx, p) {
          if (v === undefined || v === null) return null;
          return el.encode(v, ctx, p);
        },
      };
    }
    case 'tuple': {
      if (!Array.isArray(arg)) throw new CodecError(where, 'bad tuple type');
      const els = arg.map((t, i) => compileInner(t, loose, `${where}(${i})`));
      const n = els.length;
      return {
        type,
        decode(j, p, ctx) {
          if (!Array.isArray(j)) throw new CodecError(p, `expected a tuple of ${n} (array), got ${describe(j)}`);
          if (j.length !== n) throw new CodecError(p, `expected a tuple of ${n}, got ${j.length} elements`);
          return els.map((e, i) => e.decode(j[i], sub(p, i), ctx));
        },
        encode(v, ctx, p) {
          if (!Array.isArray(v) || v.length !== n) throw new CodecError(p, `expected a tuple of ${n} from the component, got ${describe(v)}`);
          return els.map((e, i) => e.encode(v[i], ctx, sub(p, i)));
        },
      };
    }
    case 'record': {
      if (!Array.isArray(arg)) throw new CodecError(where, 'bad record type');
      const fields = arg.map((f) => ({ name: f.name, js: camel(f.name), c: compileInner(f.type, loose, sub(where, f.name)) }));
      const names = new Set(fields.map((f) => f.name));
      const n = fields.length;
      return {
        type,
        fields,
        decode(j, p, ctx) {
          if (!isPlainObject(j)) throw new CodecError(p, `expected a record (object), got ${describe(j)}`);
          const out = {};
          let seen = 0;
          for (const f of fields) {
            if (!Object.hasOwn(j, f.name)) {
              if (loose && f.c.type && isPlainObject(f.c.type) && 'option' in f.c.type) {
                out[f.js] = undefined;
                continue;
              }
              throw new CodecError(p, `missing field ${JSON.stringify(f.name)}`);
            }
            seen++;
            out[f.js] = f.c.decode(j[f.name], sub(p, f.name), ctx);
          }
          if (seen !== Object.keys(j).length) {
            const unknown = Object.keys(j).filter((k) => !names.has(k));
            throw new CodecError(p, `unknown field${unknown.length > 1 ? 's' : ''} ${unknown.map((k) => JSON.stringify(k)).join(', ')}`);
          }
          return out;
        },
        encode(v, ctx, p) {
          if (v === null || typeof v !== 'object') throw new CodecError(p, `expected a record from the component, got ${describe(v)}`);
          const out = {};
          for (let i = 0; i < n; i++) {
            const f = fields[i];
            out[f.name] = f.c.encode(v[f.js], ctx, sub(p, f.name));
          }
          return out;
        },
      };
    }
    case 'variant':
    case 'result': {
      let cases;
      if (kind === 'variant') {
        if (!Array.isArray(arg)) throw new CodecError(where, 'bad variant type');
        cases = arg.map((k) => ({ name: k.name, t: k.type }));
      } else {
        if (!isPlainObject(arg) || !('ok' in arg) || !('err' in arg)) throw new CodecError(where, 'bad result type');
        cases = [
          { name: 'ok', t: arg.ok },
          { name: 'err', t: arg.err },
        ];
      }
      const byName = new Map();
      for (const k of cases) {
        byName.set(k.name, { name: k.name, c: k.t === null || k.t === undefined ? null : compileInner(k.t, loose, `${where}<${k.name}>`) });
      }
      const what = kind === 'variant' ? 'case' : 'result tag';
      return {
        type,
        cases: byName,
        decode(j, p, ctx) {
          if (!isPlainObject(j)) throw new CodecError(p, `expected a ${kind} ({"tag":…}), got ${describe(j)}`);
          const tag = j.tag;
          if (typeof tag !== 'string') throw new CodecError(p, `a ${kind} needs a string "tag"`);
          const k = byName.get(tag);
          if (!k) throw new CodecError(p, `unknown ${what} ${JSON.stringify(tag)}`);
          const nkeys = Object.keys(j).length;
          if (k.c === null) {
            if (nkeys !== 1) throw new CodecError(p, `${what} ${JSON.stringify(tag)} has no payload; only "tag" is allowed`);
            return { tag };
          }
          if (!Object.hasOwn(j, 'val')) throw new CodecError(p, `${what} ${JSON.stringify(tag)} needs a "val"`);
          if (nkeys !== 2) throw new CodecError(p, `unknown key beside "tag" and "val"`);
          return { tag, val: k.c.decode(j.val, sub(p, 'val'), ctx) };
        },
        encode(v, ctx, p) {
          if (v === null || typeof v !== 'object' || typeof v.tag !== 'string') throw new CodecError(p, `expected a ${kind} from the component, got ${describe(v)}`);
          const k = byName.get(v.tag);
          if (!k) throw new CodecError(p, `unknown ${what} ${JSON.stringify(v.tag)} from the component`);
          if (k.c === null) return { tag: v.tag };
          return { tag: v.tag, val: k.c.encode(v.val, ctx, sub(p, 'val')) };
        },
      };
    }
    case 'enum': {
      if (!Array.isArray(arg)) throw new CodecError(where, 'bad enum type');
      const names = new Set(arg);
      return {
        type,
        decode(j, p) {
          if (typeof j !== 'string') throw new CodecError(p, `expected an enum case (string), got ${describe(j)}`);
          if (!names.has(j)) throw new CodecError(p, `unknown enum case ${JSON.stringify(j)}`);
          return j;
        },
        encode(v, _c, p) {
          if (typeof v !== 'string' || !names.has(v)) throw new CodecError(p, `unknown enum case ${describe(v)} from the component`);
          return v;
        },
      };
    }
    case 'own':
    case 'borrow': {
      if (typeof arg !== 'string') throw new CodecError(where, `bad ${kind} type`);
      return {
        type,
        resource: arg,
        handleKind: kind,
        decode(j, p, ctx) {
          if (!(typeof j === 'number' && Number.isSafeInteger(j) && j >= 0) && !(ctx && ctx.acceptsObjects && j !== null && typeof j === 'object'))
            throw new CodecError(p, `expected a ${arg} handle (a non-negative integer), got ${describe(j)}`);
          if (!ctx || !ctx.handleIn) throw new CodecError(p, `a ${arg} handle cannot appear here`);
          return ctx.handleIn(arg, j, kind, p);
        },
        encode(v, ctx, p) {
          if (!ctx || !ctx.handleOut) throw new CodecError(p, `a ${arg} handle cannot appear here`);
          return ctx.handleOut(arg, v, p);
        },
      };
    }
    default:
      throw new CodecError(where, `the schema uses type ${JSON.stringify(kind)}, which this host does not know`);
  }
}

function bytesCodec(type, loose) {
  return {
    type,
    decode(j, p) {
      if (loose && j instanceof Uint8Array) return j;
      if (typeof j !== 'string') throw new CodecError(p, `expected list<u8> as a base64 string, got ${describe(j)}`);
      if (!BASE64_RE.test(j)) throw new CodecError(p, 'bad base64 (standard alphabet with = padding expected)');
      const buf = Buffer.from(j, 'base64');
      // Non-zero bits in the last character's unused part: a second spelling of the same bytes.
      if (buf.toString('base64') !== j) throw new CodecError(p, 'bad base64 (non-canonical trailing bits)');
      return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    },
    encode(v, _c, p) {
      if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('base64');
      if (Array.isArray(v)) return Buffer.from(v).toString('base64');
      throw new CodecError(p, `expected list<u8> (Uint8Array) from the component, got ${describe(v)}`);
    },
  };
}

/** True when a compiled type is the tracker's `step` record: commands of {id: u64, command}. */
export function isStepCodec(c) {
  if (!c || !c.fields) return false;
  const f = c.fields.find((x) => x.name === 'commands');
  if (!f || !isPlainObject(f.c.type) || !('list' in f.c.type)) return false;
  const el = f.c.type.list;
  return isPlainObject(el) && Array.isArray(el.record) && el.record.length === 2 && el.record[0].name === 'id' && el.record[0].type === 'u64' && el.record[1].name === 'command';
}

/** Does a schema type mention `own<…>` anywhere? (A key `"own"` only appears as a type.) */
function mentionsOwn(type) {
  return type !== null && type !== undefined && JSON.stringify(type).includes('"own":');
}

/**
 * One function of the world, compiled.
 * @typedef {object} SchemaFunction
 * @property {string} call `tracker.observe`, `validate-config`, …
 * @property {string} interface `clb:reconciler/reconciler@0.14.0`
 * @property {string} export `[method]tracker.observe`, `[static]tracker.create`, `validate-config`
 * @property {'func'|'method'|'static'|'constructor'} kind
 * @property {string|null} resource the resource the function belongs to (`tracker`), if any
 * @property {string} member jco's name for it (`observe`, `create`, `validateConfig`)
 * @property {{name:string, codec:Codec}[]} params every parameter, `self` first for methods
 * @property {Codec|null} result null for a function without a result
 * @property {boolean} resultIsResult the result is a WIT `result` (jco throws ComponentError for err)
 * @property {boolean} returnsOwn the result holds an own handle (a constructor of a handle)
 * @property {boolean} returnsStep the result is a `step`
 */

/**
 * The schema of the world, compiled.
 */
export class Schema {
  /** @param {any} json the parsed schema file @param {{loose?: boolean}} [opts] */
  constructor(json, opts = {}) {
    if (!isPlainObject(json) || typeof json.package !== 'string' || !Array.isArray(json.functions)) throw new CodecError('schema', 'expected {"package":…, "functions":[…]}');
    /** @type {string} */
    this.package = json.package;
    /** @type {Map<string, SchemaFunction>} */
    this.functions = new Map();
    /** @type {Set<string>} every interface the world exports */
    this.interfaces = new Set();
    for (const f of json.functions) {
      const where = `schema function ${f && f.call}`;
      if (!isPlainObject(f) || typeof f.call !== 'string' || typeof f.interface !== 'string' || typeof f.export !== 'string' || !Array.isArray(f.params))
        throw new CodecError(where, 'expected {"call","interface","export","params","result"}');
      let kind = 'func';
      let resource = null;
      let member = f.export;
      const m = /^\[(method|static|constructor)\]([^.]+)(?:\.(.+))?$/.exec(f.export);
      if (m) {
        kind = m[1];
        resource = m[2];
        member = m[3] ?? '';
      }
      const params = f.params.map((p) => ({ name: p.name, codec: compileType(p.type, opts) }));
      const result = f.result === null || f.result === undefined ? null : compileType(f.result, opts);
      /** @type {SchemaFunction} */
      const fn = {
        call: f.call,
        interface: f.interface,
        export: f.export,
        kind,
        resource,
        member: kind === 'constructor' ? '' : camel(member),
        params,
        result,
        resultIsResult: !!(f.result && isPlainObject(f.result) && 'result' in f.result),
        returnsOwn: mentionsOwn(f.result),
        returnsStep: isStepCodec(result),
      };
      if (kind === 'method' && (params.length === 0 || params[0].name !== 'self')) throw new CodecError(where, 'a method needs `self` first');
      this.functions.set(f.call, fn);
      this.interfaces.add(f.interface);
    }
  }

  /** @param {string} call @returns {SchemaFunction|undefined} */
  get(call) {
    return this.functions.get(call);
  }
}

const schemaCache = new Map();

/**
 * The default schema location: `schema.json` in this package, as `npm pack` packs it (its
 * `prepack` script copies it in, `postpack` removes it: the checkout never holds a copy), else
 * `hosts/schema/clb-reconciler.json` beside this folder in a checkout.
 */
const PACKED_SCHEMA_URL = new URL('./schema.json', import.meta.url);
export const DEFAULT_SCHEMA_URL = existsSync(PACKED_SCHEMA_URL)
  ? PACKED_SCHEMA_URL
  : new URL('../schema/clb-reconciler.json', import.meta.url);

/**
 * Reads and compiles the schema file.
 * @param {string|URL} [location] defaults to {@link DEFAULT_SCHEMA_URL}
 * @param {{loose?: boolean}} [opts]
 * @returns {Schema}
 */
export function loadSchema(location = DEFAULT_SCHEMA_URL, opts = {}) {
  const key = `${location}|${!!opts.loose}`;
  let s = schemaCache.get(key);
  if (!s) {
    let json;
    try {
      json = JSON.parse(readFileSync(location, 'utf8'));
    } catch (e) {
      throw new CodecError('', `cannot read the schema ${location instanceof URL ? location.pathname : location}: ${e.message}`);
    }
    s = new Schema(json, opts);
    schemaCache.set(key, s);
  }
  return s;
}

/** The canonical text of a canonical JSON value. */
export function canonicalText(value) {
  return JSON.stringify(value);
}
