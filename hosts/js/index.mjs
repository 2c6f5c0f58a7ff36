// The integrator API of the JavaScript host of the CLB reconciler.
//
// Every value crosses this API in the canonical JSON shape of docs/traces.md ("Values"): records
// as objects with the WIT's kebab-case field names, variants and results as {tag, val}, enums as
// strings, option as `null`, u64/s64 as decimal strings, list<u8> as base64 strings. Arguments
// are also taken in a looser form for convenience: u64/s64 as bigint or a safe-integer number,
// list<u8> as a Uint8Array, and an `option` record field may be left out. Results are always
// canonical (so `JSON.stringify(result)` is the text a trace holds).
//
//   import { loadComponent } from './hosts/js/index.mjs';
//   const clb = await loadComponent('clb_guest.wasm');
//   const cfg = { 'backend-pool-type': 'podIP', 'load-balancer-sku': 'standardV2', 'multiple-standard-load-balancers': [], 'write-budgets': null };
//   const { val: tracker } = await clb.Tracker.create(cfg);       // {tag:'ok', val: Tracker} | {tag:'err', val: config-error}
//   const step = tracker.observe(1000, [{ tag: 'lists-complete' }]); // {commands:[{id:'0', command:{tag:'read-nrp'}}], 'wake-at-ms':…, idle:false}

import { createWriteStream } from 'node:fs';
import { CodecError, loadSchema } from './codec.mjs';
import { GuestTrap, LoadError, disposeQuietly, loadComponentFile } from './loader.mjs';

export { CodecError, GuestTrap, LoadError };

/** The `host` this package writes in the headers of the traces it records. */
export const HOST_NAME = 'clb-host-js 0.1.0';

// ------------------------------------------------------------------------------------------------
// Types (canonical JSON shapes; see wit/clb.wit for the meaning of each field).

/**
 * @typedef {string} U64 a u64 as decimal text (the API also takes a bigint or a safe integer)
 * @typedef {{'backend-pool-type': string, 'load-balancer-sku': string, 'multiple-standard-load-balancers': string[], 'write-budgets': ?{'update-address-locations': ?{'per-minute': number, burst: number}, 'update-services': ?{'per-minute': number, burst: number}, 'arm-writes': ?{'per-minute': number, burst: number}}}} Config
 * @typedef {{field: string, reason: string, message: string}} ConfigError
 * @typedef {'container-load-balancer'|'multi-slb-local-services'|'inactive'} Mode
 * @typedef {{tag:'ok', val:any}|{tag:'err', val:any}} Result
 * @typedef {{uid:string, namespace:string, name:string, 'service-type':string|null, 'external-traffic-policy':string|null,
 *   'session-affinity':string|null, 'load-balancer-ip':string|null, 'load-balancer-class':string|null, 'ip-families':string[],
 *   ports:{name:string|null, protocol:string|null, port:number, 'target-port':({tag:'number',val:number}|{tag:'name',val:string}|null), 'node-port':number|null}[],
 *   annotations:[string,string][], finalizers:string[], deleting:boolean, 'ingress-ips':string[],
 *   labels:[string,string][]}} Service
 * @typedef {{tag:'admitted'}|{tag:'nothing-to-provision'}|{tag:'cleanup'}|{tag:'ignored', val:string}|{tag:'rejected', val:{reason:string, message:string}}} Verdict
 * @typedef {{verdict: Verdict, warnings: string[]}} Admission
 * @typedef {{tag:string, val?:any}} Observation `service-upserted`, `service-deleted`, `slice-upserted`, `slice-deleted`, `node-upserted`, `node-deleted`, `pod-upserted`, `pod-deleted`, `lists-complete`
 * @typedef {{tag:'ok'}|{tag:'public-ip-address', val:string}|{tag:'nrp-snapshot', val:any}|{tag:'failed', val:{status:number, code:string|null, 'retry-after-ms':U64|null, message:string}}} Outcome
 * @typedef {{id: U64, command: {tag:string, val?:any}}} Issued
 * @typedef {{commands: Issued[], 'wake-at-ms': U64|null, idle: boolean}} Step
 * @typedef {{version: number, payload: string}} VersionedState payload as base64
 * @typedef {{name:string, 'allow-service-placement': boolean|null, 'service-label-selector': object|null,
 *   'service-namespace-selector': object|null}} SlbConfiguration
 * @typedef {{'load-balancer': string, pools: {ipv6: boolean, name: string}[]}} ServicePlacement
 * @typedef {{service:string, 'load-balancer':string, pool:string, kind:'add'|'remove'|'delete-pool'|'ensure-pool', 'node-ips':string[]}} PoolOperation
 * @typedef {{service:string, 'load-balancer':string}} ServiceAssignment
 * @typedef {{id:U64, 'load-balancer':string, pool:string, add:string[], remove:string[], services:string[], delete:boolean, ensure:boolean}} PoolGroup
 * @typedef {{queued:number, ready:boolean, 'wake-at-ms':U64|null}} QueueStatus
 * @typedef {{tag:'updated'}|{tag:'created'}|{tag:'deleted'}|{tag:'unchanged'}|{tag:'failed', val:any}} GroupOutcome
 * @typedef {{disposition:'done'|'dropped'|'requeued'|'abandoned', 'not-before-ms':U64|null, events:{service:string, 'event-type':'normal'|'warning', reason:string, message:string}[]}} GroupReport
 * @typedef {'not-started'|'creation-in-progress'|'created'|'deletion-pending'|'deletion-in-progress'|'update-in-progress'} OperationState
 * @typedef {'inbound'|'outbound'} ServiceType
 * @typedef {'create'|'update'|'delete'} Operation
 * @typedef {{state:OperationState, 'service-type':ServiceType, count:number, 'oldest-began-ms':U64|null}} PendingOperations
 * @typedef {{operation:Operation, 'service-type':ServiceType, success:boolean, 'error-code':string, orphan:boolean, count:U64}} AttemptCount
 * @typedef {{operation:Operation, 'service-type':ServiceType, counts:U64[], count:U64, sum:U64}} Histogram
 * @typedef {{name:string, count:U64}} NamedCount
 * @typedef {{bucket:string, tokens:string, 'per-minute':number}} BudgetLevel tokens an s64 as decimal text
 * @typedef {{'service-gateway-enabled':boolean, pending:PendingOperations[], 'k8s-services':number, 'nrp-load-balancers':number,
 *   'nrp-nat-gateways':number, 'nrp-locations':number, 'nrp-addresses':number, 'pending-deletions':number, 'blocked-by-locations':number,
 *   'pod-finalizers-held':number, 'commands-in-flight':number, attempts:AttemptCount[], durations:Histogram[], retries:Histogram[],
 *   parked:NamedCount[], 'orphans-cleaned':U64, 'delete-substep-failures':NamedCount[], 'location-sync-terminal-errors':U64,
 *   'initialized-after-ms':U64|null, budgets:BudgetLevel[]}} TrackerStats
 */

/**
 * @typedef {object} LoadOptions
 * @property {string} [cacheDir] where transpiled components are kept; default `$CLB_CACHE`, else `${XDG_CACHE_HOME:-~/.cache}/clb-reconciler` (then the OS temp directory if that is not writable), as `<dir>/jco/<sha256>/`
 * @property {string|URL} [schema] the schema file; default `../schema/clb-reconciler.json` beside this package
 * @property {(level: 'debug'|'info'|'warn'|'error', message: string) => void} [log] the guest's `diagnostics.log`; default: dropped
 * @property {(message: string) => void} [panicked] the guest's `diagnostics.panicked` (it traps right after); default: kept in the GuestTrap
 * @property {number} [maxMemoryBytes] linear memory cap, checked after every call (a call that leaves more is a trap); default 512 MiB, 0 for none
 * @property {number} [deadlineMs] wall-clock limit, checked after every call (it cannot interrupt one); default none
 * @property {boolean} [autoRebuild] after a trap, rebuild the handle from its lineage before throwing, so it keeps the state from before the trapping call; default true
 * @property {string|((line: string) => void)} [record] record a trace (docs/traces.md): a file path, or a function given each line (without `\n`)
 * @property {string} [source] the header's `source` when recording; default `run`
 */

/**
 * Loads a component (any candidate of `clb:reconciler@0.14.0`): transpiles it with jco (cached by
 * its sha256), checks it exports every function of the schema, and readies an instance for the
 * pure functions. Trackers and pool queues each get an instance of their own.
 * @param {string} path the component's `.wasm`
 * @param {LoadOptions} [options]
 * @returns {Promise<Component>}
 */
export async function loadComponent(path, options = {}) {
  const schema = loadSchema(options.schema, { loose: true });
  const loaded = await loadComponentFile(path, {
    schema,
    cacheDir: options.cacheDir,
    maxMemoryBytes: options.maxMemoryBytes ?? 512 << 20,
    deadlineMs: options.deadlineMs,
    log: options.log,
    panicked: options.panicked,
  });
  return new Component(loaded, schema, options);
}

/** Writes trace lines (docs/traces.md "Lines"). */
class Recorder {
  constructor(target, header) {
    this.seq = 0;
    this.nextHandle = 0;
    if (typeof target === 'function') this.write = target;
    else {
      const stream = createWriteStream(target, { flags: 'w' });
      this.stream = stream;
      this.write = (line) => stream.write(line + '\n');
    }
    this.write(JSON.stringify(header));
  }
  line(call, args, outcome) {
    const rec = { seq: this.seq++, call, args };
    if (outcome && 'trap' in outcome) rec.trap = outcome.trap;
    else if (outcome) rec.result = outcome.result;
    this.write(JSON.stringify(rec));
  }
  close() {
    return new Promise((resolve) => (this.stream ? this.stream.end(resolve) : resolve()));
  }
}

/**
 * A loaded component.
 */
export class Component {
  /** @param {import('./loader.mjs').LoadedComponent} loaded */
  constructor(loaded, schema, options) {
    this.loaded = loaded;
    this.schema = schema;
    this.options = options;
    /** the component file's sha256, hex */
    this.sha256 = loaded.sha256;
    this.path = loaded.path;
    this._pure = loaded._probe;
    this._nextHandle = 0;
    this._recorder = options.record ? new Recorder(options.record, { format: 'clb-trace', version: 1, host: HOST_NAME, component: { package: schema.package, sha256: loaded.sha256 }, source: options.source ?? 'run' }) : null;
    const self = this;
    /** `Tracker.create` / `Tracker.importState` bound to this component. */
    this.Tracker = {
      /** @param {Config} config @returns {Promise<Result>} */
      create: (config) => Tracker.create(self, config),
      /** @param {Config} config @param {VersionedState} state @returns {Promise<Result>} */
      importState: (config, state) => Tracker.importState(self, config, state),
    };
    /** `PoolQueue.create` bound to this component. */
    this.PoolQueue = {
      /** @param {number} maxRetries @returns {Promise<PoolQueue>} */
      create: (maxRetries) => PoolQueue.create(self, maxRetries),
    };
  }

  /** Flushes and closes the trace being recorded, if any. */
  close() {
    return this._recorder ? this._recorder.close() : Promise.resolve();
  }

  /**
   * Checks a configuration and tells the mode it turns on.
   * @param {Config} config @returns {Result} {tag:'ok', val: Mode} or {tag:'err', val: ConfigError}
   */
  validateConfig(config) {
    return this._callPure('validate-config', [config]);
  }

  /**
   * What the logic does with one Service under a configuration, and the warnings for its author.
   * @param {Config} config @param {Service} service @returns {Admission}
   */
  admitService(config, service) {
    return this._callPure('admit-service', [config, service]);
  }

  /**
   * The load balancer a local Service belongs to in multi-SLB mode (upstream's placement).
   * @param {SlbConfiguration[]} configurations @param {Service} service
   * @param {{'namespace-labels': [string,string][]|null, 'current-load-balancer': string|null,
   *   'load-balancers': {name: string, rules: string[], pools: string[],
   *     frontends: {name: string, 'private-ip': string|null}[]}[],
   *   'public-ips': {name: string, address: string|null, 'ip-configuration': string|null, tags: [string,string][]}[],
   *   'resource-group': string, 'cluster-name': string}} facts
   * @returns {{tag: 'not-local', val: {'load-balancer': string, pool: string}[]}|{tag: 'at', val: ServicePlacement}|{tag: 'refused', val: string}} (upstream's words)
   */
  placeService(configurations, service, facts) {
    return this._callPure('place-service', [configurations, service, facts]);
  }

  _fn(call) {
    const fn = this.schema.get(call);
    if (!fn) throw new Error(`the schema has no function ${call}`);
    return fn;
  }

  /** Decodes API arguments (everything but self) into jco values; returns [jsArgs, canonical args object]. */
  _args(fn, values, selfHandle) {
    const js = [];
    const canon = {};
    let i = 0;
    for (const p of fn.params) {
      if (fn.kind === 'method' && p.name === 'self') {
        canon.self = selfHandle;
        continue;
      }
      const v = p.codec.decode(values[i++], p.name, null);
      js.push(v);
      canon[p.name] = this._recorder ? p.codec.encode(v, null, p.name) : undefined;
    }
    return [js, canon];
  }

  _callPure(call, values) {
    const fn = this._fn(call);
    const [js, canon] = this._args(fn, values);
    let ret;
    try {
      this._pure ??= this.loaded.instantiate();
      ret = this._pure.call(fn, null, js);
    } catch (e) {
      if (e instanceof GuestTrap) {
        this._record(call, canon, { trap: e.message });
        this._pure = null; // the next pure call gets a fresh instance
      }
      throw e;
    }
    const result = fn.result ? fn.result.encode(ret, null, 'result') : null;
    this._record(call, canon, { result });
    return result;
  }

  _record(call, args, outcome) {
    if (this._recorder) this._recorder.line(call, args, outcome);
  }

  _takeHandle() {
    return this._nextHandle++;
  }
}

/**
 * Shared by Tracker and PoolQueue: a resource in an instance of its own, with its lineage.
 */
class Handle {
  constructor(component, resource, instance, object, lineage) {
    /** @type {Component} */ this.component = component;
    this.resource = resource;
    this._instance = instance;
    this._object = object;
    /** the calls that rebuild it: [{fn, args}] */
    this._lineage = lineage;
    /** its number in the trace being recorded (and an id for logs) */
    this.handle = component._takeHandle();
  }

  /** @returns {any} the canonical result */
  _call(call, values) {
    const c = this.component;
    const fn = c._fn(call);
    const [js, canon] = c._args(fn, values, this.handle);
    if (this._retired) throw new Error(this._retired);
    if (!this._object) throw new GuestTrap(`${this.resource} ${this.handle} has no live instance (a rebuild failed)`);
    let ret;
    try {
      ret = this._instance.call(fn, this._object, js);
    } catch (e) {
      if (!(e instanceof GuestTrap)) throw e;
      c._record(call, canon, { trap: e.message });
      if (c.options.autoRebuild !== false) {
        try {
          this.rebuild();
        } catch (r) {
          this._object = null;
          e.rebuildError = r;
        }
      }
      throw e;
    }
    this._lineage.push({ fn, args: js });
    const result = fn.result ? fn.result.encode(ret, null, 'result') : null;
    c._record(call, canon, { result });
    return result;
  }

  /**
   * A fresh instance holding this handle's state from before any trapping call: its lineage is
   * run again. Recorded as a `rebuild` line. After a trap with `autoRebuild` (the default) this
   * has already been done before the GuestTrap is thrown.
   */
  rebuild() {
    const { instance, object } = runLineage(this._loaded(), this._lineage);
    this._instance = instance;
    this._object = object;
    this.component._record('rebuild', { self: this.handle }, null);
  }

  _loaded() {
    return this.component.loaded;
  }

  /** After a swap or a rollback the state lives on in another handle: this one takes no calls. */
  _retire(why) {
    this._retired = why;
    disposeQuietly(this._object);
    this._object = null;
    this._instance = null;
  }

  /** Bytes of linear memory its instance holds. */
  memoryBytes() {
    return this._instance ? this._instance.memoryBytes() : 0;
  }
}

function runLineage(loaded, lineage) {
  const inst = loaded.instantiate();
  const [first, ...rest] = lineage;
  let obj = inst.call(first.fn, null, first.args);
  if (first.fn.resultIsResult) {
    if (obj.tag !== 'ok') throw new GuestTrap(`rebuilding: ${first.fn.call} now returns err`);
    obj = obj.val;
  }
  for (const c of rest) inst.call(c.fn, obj, c.args);
  return { instance: inst, object: obj };
}

async function construct(component, call, values, make) {
  const fn = component._fn(call);
  const [js, canon] = component._args(fn, values);
  const inst = component.loaded.instantiate();
  let ret;
  try {
    ret = inst.call(fn, null, js);
  } catch (e) {
    if (e instanceof GuestTrap) component._record(call, canon, { trap: e.message });
    throw e;
  }
  let handle = null;
  const result = fn.result.encode(ret, {
    handleOut: (_resource, object) => {
      handle = make(inst, object, [{ fn, args: js }], js);
      return handle.handle;
    },
  });
  component._record(call, canon, { result });
  if (fn.resultIsResult) return result.tag === 'ok' ? { tag: 'ok', val: handle } : result;
  return handle;
}

/**
 * The stateful core: observations and outcomes in, commands out. Each tracker lives in an
 * instance of its own.
 */
export class Tracker extends Handle {
  /**
   * A tracker with empty state.
   * @param {Component} component @param {Config} config
   * @returns {Promise<{tag:'ok', val: Tracker}|{tag:'err', val: ConfigError}>}
   */
  static create(component, config) {
    return construct(component, 'tracker.create', [config], (inst, obj, lineage, js) => new Tracker(component, inst, obj, lineage, js[0]));
  }

  /**
   * A tracker from exported state (any version up to the guest's own).
   * @param {Component} component @param {Config} config @param {VersionedState} state
   * @returns {Promise<{tag:'ok', val: Tracker}|{tag:'err', val: any}>} err: `unsupported-version`, `corrupt` or `invalid-config`
   */
  static importState(component, config, state) {
    return construct(component, 'tracker.import-state', [config, state], (inst, obj, lineage, js) => new Tracker(component, inst, obj, lineage, js[0]));
  }

  constructor(component, instance, object, lineage, config) {
    super(component, 'tracker', instance, object, lineage);
    this._config = config;
    this._origin = null;
  }

  /**
   * Feeds what the watchers saw since the last call, in order.
   * @param {U64|bigint|number} nowMs @param {Observation[]} batch @returns {Step}
   */
  observe(nowMs, batch) {
    return this._call('tracker.observe', [nowMs, batch]);
  }

  /**
   * Feeds the outcomes of commands, by id, with what ARM's
   * `x-ms-ratelimit-remaining-subscription-writes` said on the latest of their answers that
   * carried it (`undefined`: none did).
   * @param {U64|bigint|number} nowMs @param {[U64|bigint|number, Outcome][]} results
   * @param {number} [armRemainingWrites] @returns {Step}
   */
  complete(nowMs, results, armRemainingWrites) {
    return this._call('tracker.complete', [nowMs, results, armRemainingWrites]);
  }

  /** Time passed. @param {U64|bigint|number} nowMs @returns {Step} */
  tick(nowMs) {
    return this._call('tracker.tick', [nowMs]);
  }

  /** The whole state. @returns {VersionedState} payload as base64 */
  exportState() {
    return this._call('tracker.export-state', []);
  }

  /** The schema version export-state writes. @returns {number} */
  stateVersion() {
    return this._call('tracker.state-version', []);
  }

  /**
   * What the tracker is doing, for dashboards. Reads only: calling it or not changes no later
   * answer. `nowMs` is when the write budgets' levels are taken.
   * @param {U64|bigint|number} nowMs @returns {TrackerStats}
   */
  stats(nowMs) {
    return this._call('tracker.stats', [nowMs]);
  }

  /**
   * Replaces the lineage by one import of the current state, so that a rebuild replays one call
   * instead of every call since creation (the trace is not affected: checkpoints are not recorded).
   */
  checkpoint() {
    const fnExport = this.component._fn('tracker.export-state');
    const fnImport = this.component._fn('tracker.import-state');
    const state = this._instance.call(fnExport, this._object, []);
    this._lineage = [{ fn: fnImport, args: [this._config, state] }];
  }

  /**
   * Hot swap: export-state, then import-state (with this tracker's config) into a fresh instance
   * of `target`. Recorded as a `swap` line when the import is accepted; this tracker then takes
   * no more calls (the state lives on in the new one, and `rollback` goes back). When the import
   * is refused, this tracker is left as it was. No state-version check is made here: compare
   * `stateVersion()` first if you need it.
   * @param {Component} target @param {{name?: string}} [info] the name a replaying host knows the target by (`--swap-component NAME=FILE`); default its sha256's first 12 digits, as clb-host
   * @returns {Promise<{tag:'ok', val: Tracker}|{tag:'err', val: any}>}
   */
  async swap(target, info = {}) {
    const c = this.component;
    const fnExport = c._fn('tracker.export-state');
    const fnImport = target._fn('tracker.import-state');
    const state = this._instance.call(fnExport, this._object, []);
    const inst = target.loaded.instantiate();
    const ret = inst.call(fnImport, null, [this._config, state]);
    if (ret.tag !== 'ok') return { tag: 'err', val: fnImport.result.encode(ret, null, 'result').val };
    const t = new Tracker(c, inst, ret.val, [{ fn: fnImport, args: [this._config, state] }], this._config);
    this._retire(`tracker ${this.handle} was swapped into tracker ${t.handle}`);
    t._loadedOverride = target.loaded;
    t._origin = { loaded: this._loaded(), lineage: this._lineage.slice(), origin: this._origin };
    const result = { tag: 'ok', val: t.handle };
    c._record('swap', { self: this.handle, component: { name: info.name ?? target.sha256.slice(0, 12), package: target.schema.package, sha256: target.sha256 } }, { result });
    return { tag: 'ok', val: t };
  }

  /**
   * After a swap: the previous version, rebuilt with the state at the swap and every call this
   * tracker accepted since. Recorded as a `rollback` line.
   * @returns {Promise<Tracker>}
   */
  async rollback() {
    if (!this._origin) throw new Error('rollback of a tracker no swap made');
    const lineage = [...this._origin.lineage, ...this._lineage.slice(1)];
    const { instance, object } = runLineage(this._origin.loaded, lineage);
    const t = new Tracker(this.component, instance, object, lineage, this._config);
    this._retire(`tracker ${this.handle} was rolled back into tracker ${t.handle}`);
    t._loadedOverride = this._origin.loaded;
    t._origin = this._origin.origin;
    this.component._record('rollback', { self: this.handle }, { result: t.handle });
    return t;
  }

  _loaded() {
    return this._loadedOverride ?? this.component.loaded;
  }
}

/**
 * The backend-pool updater's queue (multi-SLB local-service mode), in an instance of its own.
 */
export class PoolQueue extends Handle {
  /**
   * An empty queue.
   * @param {Component} component @param {number} maxRetries @returns {Promise<PoolQueue>}
   */
  static create(component, maxRetries) {
    return construct(component, 'pool-queue.create', [maxRetries], (inst, obj, lineage) => new PoolQueue(component, inst, obj, lineage));
  }

  constructor(component, instance, object, lineage) {
    super(component, 'pool-queue', instance, object, lineage);
  }

  /** @param {PoolOperation[]} operations */
  enqueue(operations) {
    this._call('pool-queue.enqueue', [operations]);
  }

  /** @param {string} service `namespace/name` @returns {number} how many queued operations were removed */
  removeOperations(service) {
    return this._call('pool-queue.remove-operations', [service]);
  }

  /** @param {U64|bigint|number} nowMs @returns {QueueStatus} */
  status(nowMs) {
    return this._call('pool-queue.status', [nowMs]);
  }

  /** @param {U64|bigint|number} nowMs @param {ServiceAssignment[]} assignment @returns {PoolGroup[]} */
  drainAndGroup(nowMs, assignment) {
    return this._call('pool-queue.drain-and-group', [nowMs, assignment]);
  }

  /** @param {U64|bigint|number} nowMs @param {U64|bigint|number} group @param {GroupOutcome} outcome @returns {GroupReport|null} */
  report(nowMs, group, outcome) {
    return this._call('pool-queue.report', [nowMs, group, outcome]);
  }
}

/**
 * The generic form: calls any function of the schema by its trace name with canonical arguments
 * (an object keyed by the WIT parameter names, `self` a Tracker or PoolQueue for methods).
 * @param {Component} component @param {string} call e.g. `admit-service` @param {Record<string, any>} args
 */
export function callByName(component, call, args) {
  const fn = component._fn(call);
  const values = fn.params.filter((p) => !(fn.kind === 'method' && p.name === 'self')).map((p) => args[p.name]);
  if (fn.kind === 'method') {
    const self = args.self;
    if (!(self instanceof Handle)) throw new CodecError('self', 'expected a Tracker or PoolQueue');
    return self._call(call, values);
  }
  if (fn.returnsOwn) {
    if (fn.resource === 'tracker') return construct(component, call, values, (inst, obj, lineage, js) => new Tracker(component, inst, obj, lineage, js[0]));
    return construct(component, call, values, (inst, obj, lineage) => new PoolQueue(component, inst, obj, lineage));
  }
  return component._callPure(call, values);
}
