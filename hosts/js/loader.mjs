// Loading a component: transpile it with jco (cached by the component's sha256), compile its core
// modules once, and make as many instances of it as the host needs.
//
// jco is run with `instantiation: 'async'`: the generated `component.js` exports
// `instantiate(getCoreModule, imports, instantiateCore)` instead of instantiating itself at
// import time, so that one transpiled module gives any number of independent instances (the
// traces contract keeps every handle in its own instance, and a trap costs a fresh one), and so
// that the host supplies the `clb:reconciler/diagnostics` import itself.

import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { homedir, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { camel, pascal } from './codec.mjs';

/** The jco version this package pins (exactly, in package.json); part of the cache stamp. */
export const JCO_VERSION = JSON.parse(readFileSync(new URL('./package.json', import.meta.url), 'utf8')).dependencies['@bytecodealliance/jco'];

const TRANSPILE_OPTIONS = Object.freeze({
  name: 'component',
  instantiation: 'async',
  noTypescript: true,
  quiet: true,
  // Core modules stay separate files (compiled once per process, instantiated per instance).
  base64Cutoff: 0,
});

/** A guest call that trapped (or was declared trapped by a limit the host checks after the call). */
export class GuestTrap extends Error {
  /** @param {string} message @param {{cause?: any, panicked?: string[]}} [info] */
  constructor(message, info = {}) {
    super(message);
    this.name = 'GuestTrap';
    this.cause = info.cause;
    /** Messages the guest sent to `diagnostics.panicked` during the call. */
    this.panicked = info.panicked ?? [];
  }
}

/** The component cannot be loaded (missing file, not a component of this world, …). */
export class LoadError extends Error {
  constructor(message) {
    super(message);
    this.name = 'LoadError';
  }
}

/** `$CLB_CACHE`, else the user's own cache folder, as hosts/setup.sh and the test API server's. */
function defaultCacheRoot() {
  return process.env.CLB_CACHE || join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'clb-reconciler');
}

function stampMatches(dir, stampText) {
  try {
    return readFileSync(join(dir, 'stamp.json'), 'utf8') === stampText && existsSync(join(dir, 'component.js'));
  } catch {
    return false;
  }
}

// Writes the transpiled files beside `dir` and renames them into place, so that a reader sees a
// whole directory or none; another process doing the same at the same time is harmless.
function writeAtomically(dir, files, stampText) {
  mkdirSync(dirname(dir), { recursive: true });
  const tmp = `${dir}.tmp-${process.pid}-${Date.now()}`;
  for (const [name, bytes] of Object.entries(files)) {
    const p = join(tmp, name);
    mkdirSync(dirname(p), { recursive: true });
    writeFileSync(p, bytes);
  }
  writeFileSync(join(tmp, 'stamp.json'), stampText);
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      renameSync(tmp, dir);
      return;
    } catch (e) {
      if (stampMatches(dir, stampText)) {
        rmSync(tmp, { recursive: true, force: true });
        return;
      }
      if (!existsSync(dir)) throw e;
      // A stale directory (another jco version or patch): move it away, then retry.
      const old = `${dir}.old-${process.pid}-${Date.now()}`;
      try {
        renameSync(dir, old);
        rmSync(old, { recursive: true, force: true });
      } catch {
        /* someone else moved it */
      }
    }
  }
  rmSync(tmp, { recursive: true, force: true });
  throw new LoadError(`cannot put the transpiled component in ${dir}`);
}

// jco drops a guest resource when its JS object is garbage-collected: a FinalizationRegistry
// calls the guest's destructor. In an instance that trapped, that destructor traps too, and an
// exception thrown from a finalization callback ends the process. The host discards trapped
// instances, so their destructors must fail quietly: the generated registry's callback is
// wrapped in a try/catch (a one-line patch of jco's output, checked to apply).
//
// A second patch is for speed only: the output wraps each export in `WebAssembly.promising`
// inside a try/catch, for JSPI. Node 20 has no `WebAssembly.promising`, and V8 builds the
// TypeError's message by re-parsing the (5,000-line) function that threw, for each of ~20
// exports: 25 ms of every instantiation. The wrapped functions are used only under JSPI, which
// this host does not use; the patch calls a module-level stand-in that returns the function
// unwrapped when `WebAssembly.promising` is missing (and is `WebAssembly.promising` otherwise).
const PATCH_VERSION = 2;
const PROMISING_ORIGINAL = 'WebAssembly.promising(';
const PROMISING_PATCHED = '_clbPromising(';
const PROMISING_DEFINITION = "const _clbPromising = typeof WebAssembly.promising === 'function' ? WebAssembly.promising : (f) => f;\n";
const FINALIZER_ORIGINAL = 'return new FinalizationRegistry(unregister);';
const FINALIZER_PATCHED = 'return new FinalizationRegistry((handle) => { try { unregister(handle); } catch (e) { /* a trapped instance */ } });';

function patchGenerated(js) {
  if (js.includes('FinalizationRegistry')) {
    if (!js.includes(FINALIZER_ORIGINAL)) throw new LoadError(`jco ${JCO_VERSION}'s output no longer creates its FinalizationRegistry as expected; the host's patch for trapped instances does not apply`);
    js = js.split(FINALIZER_ORIGINAL).join(FINALIZER_PATCHED);
  }
  if (js.includes(PROMISING_ORIGINAL)) js = PROMISING_DEFINITION + js.split(PROMISING_ORIGINAL).join(PROMISING_PATCHED);
  return js;
}

/** Drops a guest resource now, quietly (its instance may have trapped). */
export function disposeQuietly(object) {
  if (!object) return;
  const dispose = object[Symbol.dispose || Symbol.for('dispose')];
  if (typeof dispose !== 'function') return;
  try {
    dispose.call(object);
  } catch {
    /* the instance trapped: nothing to free but the instance itself */
  }
}

/**
 * Transpiles the component into `<cache>/jco/<sha256>/` unless that directory already holds the
 * output of this jco version with these options.
 * @returns {Promise<string>} the directory
 */
async function transpileCached(bytes, sha, cacheRoot) {
  const stamp = { jco: JCO_VERSION, options: TRANSPILE_OPTIONS, patch: PATCH_VERSION, sha256: sha };
  const stampText = JSON.stringify(stamp);
  const roots = [cacheRoot ?? defaultCacheRoot()];
  if (!cacheRoot && !process.env.CLB_CACHE) roots.push(join(tmpdir(), 'clb-reconciler'));
  for (const root of roots) {
    const dir = resolve(root, 'jco', sha);
    if (stampMatches(dir, stampText)) return dir;
  }
  const { transpile } = await import('@bytecodealliance/jco');
  let out;
  try {
    out = await transpile(bytes, { ...TRANSPILE_OPTIONS });
  } catch (e) {
    throw new LoadError(`jco cannot transpile it: ${e && e.message ? e.message : e}`);
  }
  const files = { ...out.files };
  files['component.js'] = patchGenerated(Buffer.from(files['component.js']).toString('utf8'));
  let lastError;
  for (const root of roots) {
    const dir = resolve(root, 'jco', sha);
    try {
      writeAtomically(dir, files, stampText);
      return dir;
    } catch (e) {
      lastError = e;
    }
  }
  throw new LoadError(`cannot write the transpiled component under ${roots.join(' or ')}: ${lastError && lastError.message}`);
}

/** Is this the error jco throws for the `err` of an exported function's `result`? */
export function isComponentError(e) {
  return e !== null && typeof e === 'object' && e.constructor && e.constructor.name === 'ComponentError' && 'payload' in e;
}

/**
 * A loaded component: transpiled, its core modules compiled. Make instances with `instantiate`.
 */
export class LoadedComponent {
  constructor(init) {
    /** @type {string} */ this.path = init.path;
    /** @type {string} hex sha256 of the component's bytes */ this.sha256 = init.sha256;
    /** @type {string} the transpiled output */ this.dir = init.dir;
    /** @type {number} bytes of the component */ this.size = init.size;
    this._instantiate = init.instantiate;
    this._modules = init.modules;
    this.schema = init.schema;
    this.options = init.options;
  }

  /**
   * A fresh instance. Synchronous: the core modules are compiled at load, and jco's
   * `instantiate` returns at once when neither callback returns a promise.
   * @param {{log?: (level:string, message:string)=>void, panicked?: (message:string)=>void}} [hooks]
   * @returns {Instance}
   * @throws {GuestTrap} when instantiating traps (a start function, a data segment)
   */
  instantiate(hooks = {}) {
    const inst = new Instance(this, hooks);
    const diagnostics = {
      log: (level, message) => {
        try {
          (hooks.log ?? this.options.log)?.(level, message);
        } catch {
          /* a host callback never traps the guest */
        }
      },
      panicked: (message) => {
        inst._panics.push(message);
        try {
          (hooks.panicked ?? this.options.panicked)?.(message);
        } catch {
          /* ditto */
        }
      },
    };
    const imports = {
      'clb:reconciler/diagnostics': diagnostics,
      'clb:reconciler/diagnostics@0.14.0': diagnostics,
    };
    const getCoreModule = (name) => {
      const m = this._modules.get(name);
      if (!m) throw new LoadError(`the transpiled component asks for a core module ${name} it did not produce`);
      return m;
    };
    const instantiateCore = (module, importObject) => {
      const instance = new WebAssembly.Instance(module, importObject);
      for (const v of Object.values(instance.exports)) if (v instanceof WebAssembly.Memory) inst._memories.push(v);
      return instance;
    };
    let root;
    try {
      root = this._instantiate(getCoreModule, withWasiShims(imports, this._wasiImports), instantiateCore);
    } catch (e) {
      if (e instanceof LoadError) throw e;
      throw new GuestTrap(`instantiating trapped: ${e && e.message ? e.message : e}`, { cause: e, panicked: inst._panics });
    }
    if (root instanceof Promise) throw new LoadError('jco\'s instantiate() did not return synchronously');
    inst.root = root;
    inst._checkMemory('instantiate');
    return inst;
  }
}

// A component of this world imports nothing but diagnostics. A candidate built with a WASI
// toolchain may also import WASI interfaces; those get preview2-shim's implementations (which
// deny by default what a sans-IO guest has no business with) rather than a load failure.
function withWasiShims(imports, shims) {
  if (!shims) return imports;
  return { ...shims, ...imports };
}

async function wasiShimsFor(importNames) {
  const wasi = importNames.filter((n) => n.startsWith('wasi:'));
  if (wasi.length === 0) return null;
  const shim = await import('@bytecodealliance/preview2-shim');
  const out = {};
  for (const name of wasi) {
    const m = /^wasi:([^/]+)\/([^@]+)/.exec(name);
    const iface = m && shim[m[1]] && shim[m[1]][camel(m[2])];
    if (iface) {
      out[name] = iface;
      out[name.replace(/@.*$/, '')] = iface;
    }
  }
  return out;
}

/**
 * One instance of a component. `call` runs one function of the schema.
 */
export class Instance {
  constructor(component, hooks) {
    this.component = component;
    this.hooks = hooks;
    this.root = null;
    /** @type {WebAssembly.Memory[]} */ this._memories = [];
    this._panics = [];
    /** set once a call trapped: every later call traps too */
    this.trapped = null;
  }

  /** Bytes of linear memory the instance holds now (wasm memories never shrink: this is its peak). */
  memoryBytes() {
    let n = 0;
    for (const m of this._memories) n += m.buffer.byteLength;
    return n;
  }

  _checkMemory(what) {
    const cap = this.component.options.maxMemoryBytes;
    if (cap && this.memoryBytes() > cap) {
      const msg = `${what}: linear memory of ${this.memoryBytes()} bytes is over the cap of ${cap} bytes (checked after the call)`;
      this.trapped = msg;
      throw new GuestTrap(msg, { panicked: this._panics.slice() });
    }
  }

  /** The jco function or class for a schema function. */
  _target(fn) {
    const iface = this.root[fn.interface];
    if (!iface) throw new LoadError(`the component does not export ${fn.interface}`);
    if (fn.kind === 'func') return iface[fn.member];
    return iface[pascal(fn.resource)];
  }

  /**
   * Calls one function. `self` is the jco resource object for methods; `args` are the jco
   * values of the other parameters, in order. Returns the jco result, with a WIT `result`
   * turned into {tag:'ok'|'err', val} (jco returns ok and throws err). Throws GuestTrap.
   * @param {import('./codec.mjs').SchemaFunction} fn
   * @param {any} self
   * @param {any[]} args
   */
  call(fn, self, args) {
    if (this.trapped) throw new GuestTrap(`the instance trapped earlier (${this.trapped}): cannot enter it`);
    this._panics = [];
    let ret;
    const deadline = this.component.options.deadlineMs;
    const t0 = deadline ? performance.now() : 0;
    try {
      switch (fn.kind) {
        case 'func':
          ret = this._target(fn)(...args);
          break;
        case 'static':
          ret = this._target(fn)[fn.member](...args);
          break;
        case 'constructor': {
          const C = this._target(fn);
          ret = new C(...args);
          break;
        }
        case 'method':
          ret = self[fn.member](...args);
          break;
        default:
          throw new Error(`unknown function kind ${fn.kind}`);
      }
      if (fn.resultIsResult) ret = { tag: 'ok', val: ret };
    } catch (e) {
      if (fn.resultIsResult && isComponentError(e)) {
        ret = { tag: 'err', val: e.payload };
      } else {
        if (e instanceof LoadError) throw e;
        const panics = this._panics.slice();
        let msg = e && e.message ? String(e.message) : String(e);
        if (panics.length) msg += ` (panicked: ${panics.join('; ')})`;
        this.trapped = msg;
        throw new GuestTrap(msg, { cause: e, panicked: panics });
      }
    }
    this._checkMemory(fn.call);
    if (deadline) {
      const ms = performance.now() - t0;
      if (ms > deadline) {
        const msg = `${fn.call}: took ${ms.toFixed(1)} ms, over the deadline of ${deadline} ms (checked after the call)`;
        this.trapped = msg;
        throw new GuestTrap(msg);
      }
    }
    return ret;
  }
}

const loaded = new Map();

/**
 * Loads a component file: checks it exports the schema's interfaces, transpiles it (cached by
 * sha256 under `$CLB_CACHE/jco/<sha256>`, by default `~/.cache/clb-reconciler/jco/<sha256>`), compiles its core modules.
 * @param {string} path
 * @param {{schema: import('./codec.mjs').Schema, cacheDir?: string, maxMemoryBytes?: number, deadlineMs?: number,
 *          log?: (level:string, message:string)=>void, panicked?: (message:string)=>void}} options
 * @returns {Promise<LoadedComponent>}
 */
export async function loadComponentFile(path, options) {
  let bytes;
  try {
    bytes = await readFile(path);
  } catch (e) {
    throw new LoadError(`cannot read the component: ${e.code === 'ENOENT' ? 'no such file' : e.message}`);
  }
  const sha = createHash('sha256').update(bytes).digest('hex');
  const key = `${sha}|${options.cacheDir ?? ''}`;
  let base = loaded.get(key);
  if (!base) {
    base = (async () => {
      // A component starts with "\0asm" and layer 1 (version 0x0d, layer 0x01).
      if (bytes.length < 8 || bytes.readUInt32BE(0) !== 0x0061736d) throw new LoadError('not a WebAssembly file');
      if (bytes[6] !== 1) throw new LoadError('a core WebAssembly module, not a component');
      const dir = await transpileCached(bytes, sha, options.cacheDir);
      const mod = await import(pathToFileURL(join(dir, 'component.js')).href);
      if (typeof mod.instantiate !== 'function') throw new LoadError('the transpiled component has no instantiate()');
      const source = readFileSync(join(dir, 'component.js'), 'utf8');
      const modules = new Map();
      for (const m of source.matchAll(/getCoreModule\('([^']+)'\)/g)) {
        if (!modules.has(m[1])) modules.set(m[1], await WebAssembly.compile(readFileSync(join(dir, m[1]))));
      }
      const importNames = [...source.matchAll(/imports\['([^']+)'\]/g)].map((m) => m[1]);
      return { dir, instantiate: mod.instantiate, modules, importNames, source };
    })();
    loaded.set(key, base);
    base.catch(() => loaded.delete(key));
  }
  const b = await base;
  const unknownImports = b.importNames.filter((n) => !n.startsWith('clb:reconciler/diagnostics') && !n.startsWith('wasi:'));
  if (unknownImports.length) throw new LoadError(`it imports ${unknownImports.join(', ')}; a component of this world imports only clb:reconciler/diagnostics`);
  const comp = new LoadedComponent({ path, sha256: sha, dir: b.dir, size: bytes.length, instantiate: b.instantiate, modules: b.modules, schema: options.schema, options });
  comp._wasiImports = await wasiShimsFor(b.importNames);
  // Refuse, at load, a component that lacks a function of the schema (another package version).
  const probe = comp.instantiate();
  for (const fn of options.schema.functions.values()) {
    const iface = probe.root[fn.interface];
    const ok = iface && (fn.kind === 'func' ? typeof iface[fn.member] === 'function' : typeof iface[pascal(fn.resource)] === 'function' && (fn.kind === 'constructor' || fn.kind === 'method' ? true : typeof iface[pascal(fn.resource)][fn.member] === 'function'));
    if (!ok) throw new LoadError(`it does not export ${fn.interface}#${fn.export}, which ${options.schema.package} has`);
    if (fn.kind === 'method' && typeof iface[pascal(fn.resource)].prototype[fn.member] !== 'function')
      throw new LoadError(`it does not export ${fn.interface}#${fn.export}, which ${options.schema.package} has`);
  }
  comp._probe = probe;
  return comp;
}
