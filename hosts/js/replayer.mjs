// Replay of traces (docs/traces.md, "Replay and the shadow check"): every call of a trace is made
// again, with the recorded arguments, on the replayed component, and each result's canonical text
// is compared with the recorded one. `replay.mjs` is the command line around this module.

import { CodecError, canonicalText } from './codec.mjs';
import { GuestTrap, LoadError, disposeQuietly } from './loader.mjs';
import { LineError, readLines } from './lines.mjs';

/** The trace cannot be read or replayed (exit 2): `FILE:LINE: why`. */
export class ReplayError extends Error {
  /** @param {number} line @param {string} why */
  constructor(line, why) {
    super(why);
    this.name = 'ReplayError';
    this.line = line;
    this.why = why;
  }
}

/** Commands a replaying host answers `ok` when only the replayed logic issued them. */
export const ANSWERED_OK = new Set([
  'emit-event',
  'update-services',
  'update-address-locations',
  'put-load-balancer',
  'put-nat-gateway',
  'delete-resource',
  'patch-service-status',
  'set-finalizer',
]);

/** At most this many extra `tracker.complete` rounds after one call. */
export const EXTRA_ROUNDS = 8;

const HOST_ACTIONS = new Set(['rebuild', 'swap', 'rollback']);

const isPlainObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const isHandle = (v) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
const wellFormed = (v) =>
  typeof v === 'string' ? v.isWellFormed() : v !== null && typeof v === 'object' ? Object.entries(v).every(([k, x]) => k.isWellFormed() && wellFormed(x)) : true;
const errText = (e) => (e && e.message ? String(e.message) : String(e));

/**
 * One divergence, as `--json` writes it (plus `kinds`, the keys it counts under in by-kind).
 * @typedef {{line:number, seq:number, call:string, args:any, recorded:any, replayed:any, kinds:string[]}} Divergence
 */

/**
 * A handle of the trace, as the replaying host holds it: its own instance, the resource in it,
 * and what rebuilds it.
 */
class Entry {
  constructor(init) {
    this.handle = init.handle;
    /** 'tracker' | 'pool-queue' */
    this.resource = init.resource;
    /** @type {import('./loader.mjs').LoadedComponent} */
    this.component = init.component;
    /** @type {import('./loader.mjs').Instance|null} */
    this.instance = init.instance ?? null;
    this.object = init.object ?? null;
    /** The calls that rebuild it, as this host made them: [{fn, args}] (jco values, self left out). */
    this.lineage = init.lineage ?? [];
    /** The config of its first call (trackers): the config a swap imports with. */
    this.config = init.config;
    /** recorded command id (decimal text) -> replayed id (bigint), for this lineage. */
    this.idMap = init.idMap ?? new Map();
    /** recorded command ids the replayed logic did not issue: their outcomes are not sent. */
    this.unmatched = init.unmatched ?? new Set();
    /** For a handle a swap made: the handle before the swap, as it was then ({component, lineage, origin}). */
    this.origin = init.origin ?? null;
  }
}

/**
 * Replays one trace.
 * @param {string} file the path as given
 * @param {{schema: import('./codec.mjs').Schema, component: import('./loader.mjs').LoadedComponent,
 *          swapComponents: Map<string, import('./loader.mjs').LoadedComponent>}} env
 * @param {{allDivergences?: boolean, onDivergence?: (d: Divergence) => void}} [opts]
 * @returns {Promise<{file:string, calls:number, divergences:Divergence[]}>}
 * @throws {ReplayError} when the trace cannot be read or replayed
 */
export async function replayTrace(file, env, opts = {}) {
  const r = new TraceReplay(file, env, opts);
  await r.run();
  return { file, calls: r.calls, divergences: r.divergences };
}

class TraceReplay {
  constructor(file, env, opts) {
    this.file = file;
    this.schema = env.schema;
    this.component = env.component;
    this.swapComponents = env.swapComponents ?? new Map();
    this.all = !!opts.allDivergences;
    this.onDivergence = opts.onDivergence;
    /** @type {Map<number, Entry>} recorded handle -> entry */
    this.handles = new Map();
    /** one past the largest handle a recorded result named */
    this.nextRecordedHandle = 0;
    /** the instance pure functions run in */
    this.pure = null;
    this.calls = 0;
    /** @type {Divergence[]} */
    this.divergences = [];
    this.completeFn = this.schema.get('tracker.complete');
    this.exportFn = this.schema.get('tracker.export-state');
    this.importFn = this.schema.get('tracker.import-state');
    // Resources handed through the codec by number (canonicalizing recorded values).
    this.numberCtx = {
      handleIn: (_r, n) => n,
      handleOut: (_r, n, p) => {
        if (!isHandle(n)) throw new CodecError(p, 'expected a handle');
        return n;
      },
    };
  }

  async run() {
    let gen;
    try {
      gen = readLines(this.file);
    } catch (e) {
      throw new ReplayError(0, `cannot read the trace: ${errText(e)}`);
    }
    let sawHeader = false;
    let expectedSeq = 0;
    try {
      for (const { line, text } of gen) {
        let rec;
        try {
          rec = JSON.parse(text);
        } catch (e) {
          throw new ReplayError(line, `bad JSON: ${errText(e)}`);
        }
        // JSON text is Unicode: a `\ud800` escape without its pair is no string (serde_json
        // refuses the line). Only a line that escapes a surrogate needs the walk.
        if (/\\u[dD][89a-fA-F]/.test(text) && !wellFormed(rec)) throw new ReplayError(line, 'bad JSON: a string holds a lone surrogate');
        if (!sawHeader) {
          this.header(line, rec);
          sawHeader = true;
          continue;
        }
        if (!isPlainObject(rec)) throw new ReplayError(line, 'a call line is a JSON object');
        if (rec.seq !== expectedSeq) {
          throw new ReplayError(line, isHandle(rec.seq) ? `seq ${rec.seq}, expected ${expectedSeq}` : `"seq" must be the call's number (expected ${expectedSeq})`);
        }
        expectedSeq++;
        this.calls++;
        const diverged = await this.line(line, rec);
        if (diverged && !this.all) return;
      }
    } catch (e) {
      if (e instanceof ReplayError) throw e;
      if (e instanceof LineError) throw new ReplayError(e.line, e.why);
      if (e && e.code === 'ENOENT') throw new ReplayError(0, 'cannot read the trace: no such file');
      if (e && e.code && e.syscall) throw new ReplayError(0, `cannot read the trace: ${errText(e)}`);
      throw e;
    }
    if (!sawHeader) throw new ReplayError(1, 'empty trace: no header line');
  }

  header(line, h) {
    if (!isPlainObject(h) || h.format !== 'clb-trace') throw new ReplayError(line, 'not a trace: the header needs "format":"clb-trace"');
    if (h.version !== 1) throw new ReplayError(line, `trace format version ${JSON.stringify(h.version)}: this host reads version 1`);
  }

  // ---------------------------------------------------------------------------------------------
  // One line.

  /** @returns {Promise<boolean>} whether it diverged */
  async line(line, rec) {
    if (typeof rec.call !== 'string') throw new ReplayError(line, 'a call line needs a string "call"');
    if (!isPlainObject(rec.args)) throw new ReplayError(line, 'a call line needs an object "args"');
    this.checkLineKeys(line, rec);
    if (HOST_ACTIONS.has(rec.call)) return this.hostAction(line, rec);
    const fn = this.schema.get(rec.call);
    if (!fn) throw new ReplayError(line, `unknown call ${JSON.stringify(rec.call)}`);

    // Arguments.
    this.checkKeys(line, rec.args, fn.params.map((p) => p.name), 'args');
    let entry = null;
    const jsArgs = [];
    const argsCtx = { handleIn: (resource, n, _kind, p) => this.lookup(line, n, resource, p).object };
    for (const p of fn.params) {
      const v = rec.args[p.name];
      if (fn.kind === 'method' && p.name === 'self') {
        if (!isHandle(v)) throw new ReplayError(line, `args.self: expected a handle (a non-negative integer), got ${JSON.stringify(v)}`);
        entry = this.lookup(line, v, fn.resource, 'args.self');
        continue;
      }
      jsArgs.push(this.decode(line, p.codec, v, `args.${p.name}`, argsCtx));
    }
    const recorded = this.recordedOutcome(line, rec, fn.result, fn.returnsStep);
    this.noteRecordedHandles(recorded);

    // tracker.complete: recorded outcomes follow the id map.
    let callArgs = jsArgs;
    if (fn.call === 'tracker.complete') {
      const ri = fn.params.findIndex((p) => p.name === 'results') - 1;
      const mapped = [];
      for (const [id, outcome] of jsArgs[ri]) {
        const key = id.toString();
        if (entry.unmatched.has(key)) continue;
        mapped.push([entry.idMap.has(key) ? entry.idMap.get(key) : id, outcome]);
      }
      callArgs = jsArgs.slice();
      callArgs[ri] = mapped;
    }

    // The call: a method in its handle's instance, a handle's first call in a fresh instance,
    // a pure function in the pure instance.
    let inst;
    if (fn.kind === 'method') inst = entry.instance;
    else if (fn.returnsOwn) inst = this.freshInstance(line, this.component);
    else inst = this.pure ??= this.freshInstance(line, this.component);
    let replayedTrap = null;
    let ret;
    try {
      ret = inst.call(fn, entry && entry.object, callArgs);
    } catch (e) {
      if (!(e instanceof GuestTrap)) throw this.internal(line, e);
      replayedTrap = e.message;
    }

    // The replayed result, canonical; a handle it makes is named as the recorded result names it.
    let replayed = null;
    let made = null;
    const recHandle = this.recordedHandle(fn, recorded);
    if (replayedTrap === null && fn.result) {
      const outCtx = {
        handleOut: (resource, object) => {
          if (made) throw new CodecError('result', 'a result with more than one handle: not part of this world');
          made = { resource, object };
          return recHandle ?? this.nextRecordedHandle;
        },
      };
      try {
        replayed = fn.result.encode(ret, outCtx, 'result');
      } catch (e) {
        throw new ReplayError(line, `the replayed result does not encode: ${errText(e)}`);
      }
    }

    // Command ids.
    let kinds = null;
    let extra = [];
    if (fn.returnsStep) {
      const recCmds = recorded.trap === undefined ? recorded.value.commands : [];
      if (replayedTrap === null) {
        const a = align(recCmds, replayed.commands);
        replayed = { ...replayed, commands: a.aligned };
        for (const [recId, repId] of a.pairs) {
          entry.idMap.set(recId, BigInt(repId));
          entry.unmatched.delete(recId);
        }
        for (const i of a.unmatchedRecorded) entry.unmatched.add(recCmds[i].id);
        kinds = a.kinds;
        extra = a.unmatchedReplayed.map((i) => replayed.commands[i]).filter((c) => ANSWERED_OK.has(c.command.tag));
      } else {
        // The replayed logic issued none of the recorded commands.
        for (const c of recCmds) if (!entry.idMap.has(c.id)) entry.unmatched.add(c.id);
      }
    }

    // Compare.
    const diverged = this.compare(line, rec, fn, recorded, replayed, replayedTrap, kinds);

    // What the call leaves behind.
    if (fn.kind === 'method') {
      if (replayedTrap === null) {
        entry.lineage.push({ fn, args: callArgs });
        if (extra.length) await this.extraCompletes(line, entry, callArgs[fn.params.findIndex((p) => p.name === 'now-ms') - 1], extra);
      } else if (recorded.trap === undefined) {
        // A trap on only the replaying side: rebuild the handle as a `rebuild` line would.
        this.rebuild(line, entry);
      }
    } else if (fn.returnsOwn) {
      if (made && recHandle === null) disposeQuietly(made.object);
      if (made && recHandle !== null) {
        const configIdx = fn.params.findIndex((p) => p.name === 'config');
        this.handles.set(
          recHandle,
          new Entry({
            handle: recHandle,
            resource: made.resource,
            component: this.component,
            instance: inst,
            object: made.object,
            lineage: [{ fn, args: jsArgs }],
            config: configIdx >= 0 ? jsArgs[configIdx] : undefined,
          }),
        );
      }
    } else if (replayedTrap !== null) {
      this.pure = null; // a fresh instance for the next pure call
    }
    return diverged;
  }

  checkLineKeys(line, rec) {
    for (const k of Object.keys(rec)) {
      if (!['seq', 'call', 'args', 'result', 'trap'].includes(k)) throw new ReplayError(line, `unknown key ${JSON.stringify(k)} in a call line`);
    }
    if (Object.hasOwn(rec, 'result') && Object.hasOwn(rec, 'trap')) throw new ReplayError(line, 'a call line has "result" or "trap", not both');
    if (Object.hasOwn(rec, 'trap') && typeof rec.trap !== 'string') throw new ReplayError(line, '"trap" is the trap\'s text (a string)');
  }

  /**
   * The recorded outcome of a line: {trap} or {value, text}. `text` is the canonical text of the
   * recorded result when it decodes as the function's result type; a result that does not (an
   * edited trace) is compared as the text JSON gives it, and so differs. Where the result must be
   * read (a step, whose commands are aligned), one that does not decode is an error.
   */
  recordedOutcome(line, rec, codec, mustDecode) {
    if (Object.hasOwn(rec, 'trap')) return { trap: rec.trap };
    // A line with neither is read as `"result":null` (as clb-host reads it).
    const result = Object.hasOwn(rec, 'result') ? rec.result : null;
    if (codec === null) return { value: result, text: canonicalText(result) };
    try {
      const value = codec.encode(codec.decode(result, 'result', this.numberCtx), this.numberCtx, 'result');
      return { value, text: canonicalText(value) };
    } catch (e) {
      if (!(e instanceof CodecError)) throw e;
      if (mustDecode) throw new ReplayError(line, `recorded ${e.message}`);
      return { value: result, text: canonicalText(result), undecodable: true };
    }
  }

  /** Keeps `nextRecordedHandle` one past the largest handle a recorded result named. */
  noteRecordedHandles(recorded) {
    if (recorded.trap !== undefined || recorded.undecodable) return;
    const v = recorded.value;
    const h = isHandle(v) ? v : v && typeof v === 'object' && v.tag === 'ok' && isHandle(v.val) ? v.val : null;
    if (h !== null && h >= this.nextRecordedHandle) this.nextRecordedHandle = h + 1;
  }

  /** The handle a recorded constructor result names, or null. */
  recordedHandle(fn, recorded) {
    if (!fn.returnsOwn || recorded.trap !== undefined || recorded.undecodable) return null;
    let h = recorded.value;
    if (fn.resultIsResult) h = h.tag === 'ok' ? h.val : null;
    return isHandle(h) ? h : null;
  }

  lookup(line, n, resource, path) {
    const e = this.handles.get(n);
    if (!e) throw new ReplayError(line, `${path}: handle ${n} does not exist in this replay`);
    if (resource && e.resource !== resource) throw new ReplayError(line, `${path}: handle ${n} is a ${e.resource}, not a ${resource}`);
    return e;
  }

  checkKeys(line, obj, names, where) {
    for (const n of names) if (!Object.hasOwn(obj, n)) throw new ReplayError(line, `${where}: missing ${JSON.stringify(n)}`);
    if (Object.keys(obj).length !== names.length) {
      const unknown = Object.keys(obj).filter((k) => !names.includes(k));
      throw new ReplayError(line, `${where}: unknown ${unknown.map((k) => JSON.stringify(k)).join(', ')}`);
    }
  }

  decode(line, codec, value, path, ctx) {
    try {
      return codec.decode(value, path, ctx);
    } catch (e) {
      if (e instanceof CodecError) throw new ReplayError(line, e.message);
      throw e;
    }
  }

  /** The recorded arguments, canonical (they decoded, so they encode). */
  canonicalArgs(fn, args) {
    const out = {};
    for (const p of fn.params) {
      if (fn.kind === 'method' && p.name === 'self') out.self = args.self;
      else out[p.name] = p.codec.encode(p.codec.decode(args[p.name], p.name, this.numberCtx), this.numberCtx, p.name);
    }
    return out;
  }

  internal(line, e) {
    if (e instanceof ReplayError) return e;
    if (e instanceof LoadError) return new ReplayError(line, errText(e));
    return new ReplayError(line, `internal error of the JavaScript host: ${e && e.stack ? e.stack : e}`);
  }

  freshInstance(line, component) {
    try {
      return component.instantiate();
    } catch (e) {
      if (e instanceof GuestTrap) {
        // An instance that cannot even start: every call on it traps.
        return { call: () => { throw e; }, trapped: e.message };
      }
      throw this.internal(line, e);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Comparison and reports.

  /** Records a divergence when the replayed outcome differs; returns whether it did. */
  compare(line, rec, fn, recorded, replayed, replayedTrap, stepKinds) {
    const recTrap = recorded.trap !== undefined;
    const repTrap = replayedTrap !== null;
    let same;
    if (recTrap || repTrap) same = recTrap && repTrap;
    else same = recorded.text === canonicalText(replayed);
    if (same) return false;
    let kinds;
    if (recTrap !== repTrap) kinds = ['trap'];
    else if (stepKinds) kinds = stepKinds;
    else kinds = [rec.call];
    /** @type {Divergence} */
    const d = {
      line,
      seq: rec.seq,
      call: rec.call,
      args: fn ? this.canonicalArgs(fn, rec.args) : rec.args,
      recorded: recTrap ? { trap: recorded.trap } : recorded.value,
      replayed: repTrap ? { trap: replayedTrap } : replayed,
      kinds,
    };
    this.divergences.push(d);
    this.onDivergence?.(d);
    return true;
  }

  // ---------------------------------------------------------------------------------------------
  // Commands only the replayed logic issued.

  async extraCompletes(line, entry, nowMs, commands) {
    let pending = commands;
    for (let round = 0; round < EXTRA_ROUNDS && pending.length; round++) {
      const args = [nowMs, pending.map((c) => [BigInt(c.id), { tag: 'ok' }]), undefined];
      let ret;
      try {
        ret = entry.instance.call(this.completeFn, entry.object, args);
      } catch (e) {
        if (!(e instanceof GuestTrap)) throw this.internal(line, e);
        // Not compared; the handle is rebuilt from its lineage, without this call.
        this.rebuild(line, entry);
        return;
      }
      entry.lineage.push({ fn: this.completeFn, args });
      let step;
      try {
        step = this.completeFn.result.encode(ret, null, 'result');
      } catch (e) {
        throw new ReplayError(line, `the result of an extra tracker.complete does not encode: ${errText(e)}`);
      }
      pending = step.commands.filter((c) => ANSWERED_OK.has(c.command.tag));
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Rebuilds and host actions.

  /**
   * A fresh instance of `component` running `lineage` (unchecked); a trap in it means the trace
   * cannot be replayed (those calls did not trap before).
   * @returns {{instance: any, object: any}}
   */
  runLineage(line, component, lineage, what) {
    const inst = this.freshInstance(line, component);
    const [first, ...rest] = lineage;
    let call = first.fn.call;
    try {
      let object = inst.call(first.fn, null, first.args);
      if (first.fn.resultIsResult) {
        if (object.tag !== 'ok') throw new ReplayError(line, `${what}: ${first.fn.call} returns err now`);
        object = object.val;
      }
      for (const c of rest) {
        call = c.fn.call;
        inst.call(c.fn, object, c.args);
      }
      return { instance: inst, object };
    } catch (e) {
      if (e instanceof GuestTrap) throw new ReplayError(line, `${what}: ${call} trapped on a call it took before: ${e.message}`);
      throw this.internal(line, e);
    }
  }

  /** Rebuilds a handle in place: a fresh instance, its lineage re-run. */
  rebuild(line, entry) {
    disposeQuietly(entry.object);
    const { instance, object } = this.runLineage(line, entry.component, entry.lineage, `rebuilding handle ${entry.handle}`);
    entry.instance = instance;
    entry.object = object;
  }

  async hostAction(line, rec) {
    const call = rec.call;
    const args = rec.args;
    if (call === 'swap') this.checkKeys(line, args, ['self', 'component'], 'args');
    else this.checkKeys(line, args, ['self'], 'args');
    if (!isHandle(args.self)) throw new ReplayError(line, `args.self: expected a handle (a non-negative integer), got ${JSON.stringify(args.self)}`);
    const entry = this.lookup(line, args.self, call === 'swap' ? 'tracker' : null, 'args.self');

    if (call === 'rebuild') {
      // Nothing is compared: a rebuild line has no result (one that holds one is not read).
      this.rebuild(line, entry);
      return false;
    }

    if (call === 'swap') {
      const c = args.component;
      if (!isPlainObject(c)) throw new ReplayError(line, 'args.component: expected {"name","package","sha256"}');
      this.checkKeys(line, c, ['name', 'package', 'sha256'], 'args.component');
      for (const k of ['name', 'package', 'sha256']) if (typeof c[k] !== 'string') throw new ReplayError(line, `args.component.${k}: expected a string`);
      const recorded = this.recordedOutcome(line, rec, this.importFn.result, false);
      this.noteRecordedHandles(recorded);
      const recHandle = this.recordedHandle(this.importFn, recorded);
      const component = this.swapComponents.get(c.name) ?? this.component;
      let exported;
      try {
        exported = entry.instance.call(this.exportFn, entry.object, []);
      } catch (e) {
        if (e instanceof GuestTrap) throw new ReplayError(line, `swap: the replayed logic trapped on export-state: ${e.message}`);
        throw this.internal(line, e);
      }
      const inst = this.freshInstance(line, component);
      let trap = null;
      let ret;
      try {
        ret = inst.call(this.importFn, null, [entry.config, exported]);
      } catch (e) {
        if (!(e instanceof GuestTrap)) throw this.internal(line, e);
        trap = e.message;
      }
      let replayed = null;
      let made = null;
      if (trap === null) {
        replayed = this.importFn.result.encode(ret, {
          handleOut: (resource, object) => {
            made = { resource, object };
            return recHandle ?? this.nextRecordedHandle;
          },
        });
      }
      if (made && recHandle === null) disposeQuietly(made.object);
      if (made && recHandle !== null) {
        // The state moved: the handle swapped from is gone (a call on it is exit 2).
        this.handles.delete(args.self);
        disposeQuietly(entry.object);
        this.handles.set(
          recHandle,
          new Entry({
            handle: recHandle,
            resource: 'tracker',
            component,
            instance: inst,
            object: made.object,
            lineage: [{ fn: this.importFn, args: [entry.config, exported] }],
            config: entry.config,
            idMap: new Map(entry.idMap),
            unmatched: new Set(entry.unmatched),
            origin: { component: entry.component, lineage: entry.lineage.slice(), origin: entry.origin },
          }),
        );
      }
      const canonArgs = { self: args.self, component: { name: c.name, package: c.package, sha256: c.sha256 } };
      return this.compareAction(line, rec, canonArgs, recorded, replayed, trap);
    }

    // rollback: its result is the new handle, a number.
    if (Object.hasOwn(rec, 'trap')) throw new ReplayError(line, 'a rollback line has a result, the new handle');
    if (!isHandle(rec.result)) throw new ReplayError(line, `result: a rollback's result is the new handle, got ${JSON.stringify(rec.result)}`);
    const h2 = rec.result;
    if (h2 >= this.nextRecordedHandle) this.nextRecordedHandle = h2 + 1;
    if (!entry.origin) throw new ReplayError(line, `rollback of handle ${args.self}, which no swap made`);
    const lineage = [...entry.origin.lineage, ...entry.lineage.slice(1)];
    const { instance, object } = this.runLineage(line, entry.origin.component, lineage, `rolling back handle ${args.self}`);
    // The version rolled back from is gone.
    this.handles.delete(args.self);
    disposeQuietly(entry.object);
    this.handles.set(
      h2,
      new Entry({
        handle: h2,
        resource: entry.resource,
        component: entry.origin.component,
        instance,
        object,
        lineage,
        config: entry.config,
        idMap: new Map(entry.idMap),
        unmatched: new Set(entry.unmatched),
        origin: entry.origin.origin,
      }),
    );
    return false;
  }

  /** `compare` for a host action line (its args are already canonical). */
  compareAction(line, rec, canonArgs, recorded, replayed, replayedTrap) {
    return this.compare(line, { ...rec, args: canonArgs }, null, recorded, replayed, replayedTrap, null);
  }
}

/**
 * Command-id alignment: each recorded command, in order, is matched to the first unmatched
 * replayed command with the same canonical `command` text. The replayed commands come back in
 * their order, matched ones carrying the recorded id.
 * @param {{id:string, command:any}[]} recorded canonical
 * @param {{id:string, command:any}[]} replayed canonical
 */
export function align(recorded, replayed) {
  const texts = replayed.map((c) => canonicalText(c.command));
  const taken = new Array(replayed.length).fill(false);
  const aligned = replayed.map((c) => ({ id: c.id, command: c.command }));
  const pairs = [];
  const unmatchedRecorded = [];
  for (let i = 0; i < recorded.length; i++) {
    const t = canonicalText(recorded[i].command);
    let j = -1;
    for (let k = 0; k < texts.length; k++) {
      if (!taken[k] && texts[k] === t) {
        j = k;
        break;
      }
    }
    if (j < 0) {
      unmatchedRecorded.push(i);
      continue;
    }
    taken[j] = true;
    pairs.push([recorded[i].id, replayed[j].id]);
    aligned[j].id = recorded[i].id;
  }
  const unmatchedReplayed = [];
  for (let k = 0; k < replayed.length; k++) if (!taken[k]) unmatchedReplayed.push(k);
  const tags = new Set();
  for (const i of unmatchedRecorded) tags.add(recorded[i].command.tag);
  for (const k of unmatchedReplayed) tags.add(replayed[k].command.tag);
  const kinds = tags.size ? [...tags].sort(byteOrder) : ['step'];
  return { aligned, pairs, unmatchedRecorded, unmatchedReplayed, kinds };
}

/** Ascending byte order of UTF-8 strings (for ASCII keys, code-unit order). */
export function byteOrder(a, b) {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return Buffer.compare(x, y);
}
