//! Writing traces: the serving side hands over owned values, a writer thread encodes and
//! writes them, so that a slow or full disk never holds up a guest call.
//!
//! Two modes. [`Overflow::Block`] (`simulate`): nothing is ever dropped. [`Overflow::Drop`]
//! (`run`): a full queue, a failed write or a file that cannot be opened costs lines, counted,
//! never a wait. After a loss, and when a file reaches its size, the trace goes on from the
//! tracker's state: the supervisor asks [`Recorder::needs_state`] before each input and, when it
//! is due, hands a checkpoint to [`Recorder::resync`], which starts a new file with a header and
//! a `tracker.import-state` of that state under a new handle. Every file is thereby replayable
//! on its own. Handles created before it (the backend-pool queue, which has no state export) are
//! no longer recorded in it.

use super::canonical::{CodecError, write_serde, write_str};
use super::schema::Signatures;
use serde_json::Value as Json;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The format version this host writes (`docs/traces.md`).
pub const FORMAT_VERSION: u32 = 1;

/// What to do when the writer cannot keep up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overflow {
    /// Wait for it (simulate: a trace must be whole).
    Block,
    /// Drop the line and count it (a live controller: a reconcile never waits on a disk).
    Drop,
}

/// Where and how much to record.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub path: PathBuf,
    /// A file is rotated once it holds this many bytes.
    pub max_file_bytes: u64,
    /// Rotated files kept besides the current one (`FILE.1` the newest).
    pub keep_files: u32,
    /// Lines waiting for the writer at most.
    pub queue_lines: usize,
    pub overflow: Overflow,
    /// What the header says was recorded (`simulate <name>`, `run`).
    pub source: String,
}

impl RecordOptions {
    /// The defaults of `run --record`: 256 MiB a file, 4 older files, 4,096 queued lines.
    pub fn live(path: PathBuf) -> Self {
        Self {
            path,
            max_file_bytes: 256 << 20,
            keep_files: 4,
            queue_lines: 4_096,
            overflow: Overflow::Drop,
            source: "run".into(),
        }
    }

    /// `simulate --record`: one whole file, never rotated, nothing dropped.
    pub fn whole(path: PathBuf, source: String) -> Self {
        Self { path, max_file_bytes: u64::MAX, keep_files: 0, queue_lines: 1_024, overflow: Overflow::Block, source }
    }
}

/// Counters for `/metrics` and the log.
#[derive(Debug, Default)]
pub struct RecordStats {
    pub lines_written: AtomicU64,
    /// Lines lost to a full queue, a failed write or a trace waiting for a state to go on from.
    pub lines_dropped: AtomicU64,
    pub bytes_written: AtomicU64,
    pub write_errors: AtomicU64,
    /// Files started (the first one included).
    pub files: AtomicU64,
}

/// The component a line names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentRef {
    /// How the host knows it: `builtin`, a scenario's name for it, a file, or its short sha256.
    pub name: String,
    /// `clb:reconciler@X.Y.Z`.
    pub package: String,
    pub sha256: String,
}

/// One argument of a recorded call, in the order of the function's parameters.
pub enum Arg {
    /// A resource, by its trace-local handle.
    Handle(u64),
    /// Anything else, serialized by serde's derive when the writer gets to it.
    Value(Lazy),
}

/// A value serialized on the writer thread.
pub type Lazy = Box<dyn FnOnce() -> Json + Send>;

/// An owned value to serialize later.
pub fn lazy<T: serde::Serialize + Send + 'static>(value: T) -> Lazy {
    Box::new(move || serde_json::to_value(&value).expect("bindgen types serialize"))
}

/// An argument from an owned value.
pub fn arg<T: serde::Serialize + Send + 'static>(value: T) -> Arg {
    Arg::Value(lazy(value))
}

/// How a recorded call ended.
pub enum Ended {
    /// Its result (`Json::Null` through [`lazy`] for a function without one).
    Returned(Lazy),
    /// A function without a result returned.
    Unit,
    /// It trapped; the text is for people.
    Trapped(String),
}

/// A line the writer turns into text, given the functions' types and its `seq`.
type Encode = Box<dyn FnOnce(&Signatures, u64) -> Result<String, CodecError> + Send>;

enum Item {
    Line(Encode),
    /// Start a new file with this header before the line that follows.
    Rotate(String),
    Flush(SyncSender<()>),
}

struct Shared {
    stats: RecordStats,
    /// Lines were lost since the last file began: the trace needs a state to go on from.
    broken: AtomicBool,
    /// The current file is full.
    rotate_due: AtomicBool,
    /// The writer has a file open (a resync could be written).
    ready: AtomicBool,
    next_handle: AtomicU64,
    /// Handles whose lines the current file can replay.
    live: Mutex<BTreeSet<u64>>,
    /// When [`Recorder::resync`] was last tried (`u64::MAX`: never), in milliseconds since the recorder started: a
    /// resync costs a checkpoint, so a writer that cannot keep up is not asked every input.
    last_resync_ms: AtomicU64,
}

/// How often a lost trace tries to go on from a state, at most.
const RESYNC_EVERY_MS: u64 = 1_000;

/// A trace being written; cheap to share behind an `Arc`.
pub struct Recorder {
    shared: Arc<Shared>,
    tx: SyncSender<Item>,
    overflow: Overflow,
    source: String,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    started: std::time::Instant,
}

/// Why recording could not start.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: cannot write the trace: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl Recorder {
    /// Starts the writer. In [`Overflow::Block`] mode the file must open now; in
    /// [`Overflow::Drop`] mode a file that cannot be opened is retried, and lines are dropped
    /// and counted meanwhile.
    pub fn start(
        options: RecordOptions,
        signatures: Signatures,
        component: &ComponentRef,
    ) -> Result<Arc<Self>, RecordError> {
        let shared = Arc::new(Shared {
            stats: RecordStats::default(),
            broken: AtomicBool::new(false),
            rotate_due: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            next_handle: AtomicU64::new(0),
            live: Mutex::new(BTreeSet::new()),
            last_resync_ms: AtomicU64::new(u64::MAX),
        });
        let header = header(component, &options.source);
        let file = match open(&options.path) {
            Ok(file) => Some(file),
            Err(source) if options.overflow == Overflow::Block => {
                return Err(RecordError::Open { path: options.path.display().to_string(), source });
            }
            Err(error) => {
                tracing::warn!(path = %options.path.display(), %error, "cannot open the trace file; retrying, lines are dropped meanwhile");
                shared.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                None
            }
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(options.queue_lines.max(1));
        let mut writer = Writer {
            shared: shared.clone(),
            options: options.clone(),
            signatures,
            file: None,
            written: 0,
            seq: 0,
            discarding: false,
        };
        if let Some(file) = file {
            writer.begin(file, &header);
        } else {
            shared.broken.store(true, Ordering::Relaxed);
        }
        let thread = std::thread::Builder::new()
            .name("clb-trace".into())
            .spawn(move || {
                lower_priority();
                writer.run(rx, header)
            })
            .expect("spawning the trace writer");
        Ok(Arc::new(Self {
            shared,
            tx,
            overflow: options.overflow,
            source: options.source,
            writer: Mutex::new(Some(thread)),
            started: std::time::Instant::now(),
        }))
    }

    pub fn stats(&self) -> &RecordStats {
        &self.shared.stats
    }

    /// The handle the next created resource gets; it is live in the current file.
    pub fn new_handle(&self) -> u64 {
        let handle = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        self.shared.live.lock().unwrap_or_else(|e| e.into_inner()).insert(handle);
        handle
    }

    fn is_live(&self, handle: u64) -> bool {
        self.shared.live.lock().unwrap_or_else(|e| e.into_inner()).contains(&handle)
    }

    /// Whether the trace can go on only from a state: lines were lost, or the file is full.
    /// Checked before each input; cheap.
    pub fn needs_state(&self) -> bool {
        let due = (self.shared.broken.load(Ordering::Relaxed) || self.shared.rotate_due.load(Ordering::Relaxed))
            && self.shared.ready.load(Ordering::Relaxed);
        // A whole trace (simulate) goes on at once; a live one at most once a second.
        let last = self.shared.last_resync_ms.load(Ordering::Relaxed);
        due && (self.overflow == Overflow::Block
            || last == u64::MAX
            || self.elapsed_ms() >= last.saturating_add(RESYNC_EVERY_MS))
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Goes on from `state` (a `versioned-state`) under a new handle, in a new file; returns
    /// the handle, or `None` when this failed too (then the next input tries again).
    pub fn resync(&self, config: Lazy, state: Lazy, component: &ComponentRef) -> Option<u64> {
        self.shared.last_resync_ms.store(self.elapsed_ms(), Ordering::Relaxed);
        let handle = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        let rotate = Item::Rotate(header(component, &self.source));
        if !self.send(rotate) {
            return None;
        }
        let line = call_line(
            "tracker.import-state",
            vec![Arg::Value(config), Arg::Value(state)],
            Ended::Returned(Box::new(move || serde_json::json!({ "Ok": handle }))),
        );
        if !self.send(Item::Line(line)) {
            return None;
        }
        *self.shared.live.lock().unwrap_or_else(|e| e.into_inner()) = BTreeSet::from([handle]);
        self.shared.broken.store(false, Ordering::Relaxed);
        self.shared.rotate_due.store(false, Ordering::Relaxed);
        Some(handle)
    }

    /// Starts a new file whose header names `component`, for calls that need no state (the pure
    /// functions, such as the webhook's `admit-service`): its trace begins one when the version
    /// judging changes, or when lines were lost or the file is full ([`Self::needs_state`]).
    /// `false` when the writer's queue was full (the next call tries again).
    pub fn begin_file(&self, component: &ComponentRef) -> bool {
        if !self.send(Item::Rotate(header(component, &self.source))) {
            return false;
        }
        self.shared.live.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.shared.broken.store(false, Ordering::Relaxed);
        self.shared.rotate_due.store(false, Ordering::Relaxed);
        true
    }

    /// Records a call to a function of the world. Calls on a handle the current file does not
    /// hold are left out.
    pub fn call(&self, call: &'static str, args: Vec<Arg>, ended: Ended) {
        if args.iter().any(|a| matches!(a, Arg::Handle(h) if !self.is_live(*h))) {
            return;
        }
        self.line(call_line(call, args, ended));
    }

    /// `rebuild`: the instance holding `handle` trapped and was rebuilt.
    pub fn rebuild(&self, handle: u64) {
        if self.is_live(handle) {
            self.line(Box::new(move |_, seq| {
                Ok(format!("{{\"seq\":{seq},\"call\":\"rebuild\",\"args\":{{\"self\":{handle}}}}}"))
            }));
        }
    }

    /// `swap`: the state of `handle` moved into `to`; `result` is the import's, `{"Ok": h}`
    /// with a new handle or `{"Err": state-error}` in serde's form.
    pub fn swap(&self, handle: u64, to: &ComponentRef, result: Lazy) {
        if !self.is_live(handle) {
            return;
        }
        let to = to.clone();
        self.line(Box::new(move |signatures, seq| {
            let import = signatures.get("tracker.import-state").and_then(|s| s.result.clone());
            let import =
                import.ok_or_else(|| CodecError { path: "swap".into(), why: "no tracker.import-state".into() })?;
            let mut out = format!("{{\"seq\":{seq},\"call\":\"swap\",\"args\":{{\"self\":{handle},\"component\":");
            component_json(&mut out, &to);
            out.push_str("},\"result\":");
            write_serde(&mut out, &result(), &import)?;
            out.push('}');
            Ok(out)
        }));
    }

    /// `rollback`: back to the version before the swap that made `handle`, as `new`.
    pub fn rollback(&self, handle: u64, new: u64) {
        if self.is_live(handle) {
            self.shared.live.lock().unwrap_or_else(|e| e.into_inner()).insert(new);
            self.line(Box::new(move |_, seq| {
                Ok(format!("{{\"seq\":{seq},\"call\":\"rollback\",\"args\":{{\"self\":{handle}}},\"result\":{new}}}"))
            }));
        }
    }

    /// Waits until everything handed over so far is written (the end of a `simulate`).
    pub fn flush(&self) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        if self.tx.send(Item::Flush(tx)).is_ok() {
            rx.recv().ok();
        }
    }

    fn line(&self, encode: Encode) {
        if self.shared.broken.load(Ordering::Relaxed) {
            self.shared.stats.lines_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if !self.send(Item::Line(encode)) {
            self.shared.broken.store(true, Ordering::Relaxed);
        }
    }

    /// Hands an item to the writer; false when it was dropped (counted).
    fn send(&self, item: Item) -> bool {
        let sent = match self.overflow {
            Overflow::Block => self.tx.send(item).is_ok(),
            Overflow::Drop => match self.tx.try_send(item) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
        };
        if !sent {
            self.shared.stats.lines_dropped.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("source", &self.source).field("stats", &self.shared.stats).finish()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.flush();
        // The writer ends when every sender is gone; this one is the last.
        let (tx, _) = std::sync::mpsc::sync_channel(1);
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(thread) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            thread.join().ok();
        }
    }
}

fn header(component: &ComponentRef, source: &str) -> String {
    let mut out = format!(
        "{{\"format\":\"clb-trace\",\"version\":{FORMAT_VERSION},\"host\":\"clb-host {}\",\"component\":",
        env!("CARGO_PKG_VERSION")
    );
    component_json(&mut out, component);
    out.push_str(",\"source\":");
    write_str(&mut out, source);
    out.push('}');
    out
}

fn component_json(out: &mut String, component: &ComponentRef) {
    out.push_str("{\"name\":");
    write_str(out, &component.name);
    out.push_str(",\"package\":");
    write_str(out, &component.package);
    out.push_str(",\"sha256\":");
    write_str(out, &component.sha256);
    out.push('}');
}

fn call_line(call: &'static str, args: Vec<Arg>, ended: Ended) -> Encode {
    Box::new(move |signatures, seq| {
        let why = |why: String| CodecError { path: call.into(), why };
        let signature = signatures.get(call).ok_or_else(|| why("not a function of this component".into()))?;
        if signature.params.len() != args.len() {
            return Err(why(format!("{} arguments for {} parameters", args.len(), signature.params.len())));
        }
        let mut out = format!("{{\"seq\":{seq},\"call\":\"{call}\",\"args\":{{");
        for (i, ((name, ty), arg)) in signature.params.iter().zip(args).enumerate() {
            if i > 0 {
                out.push(',');
            }
            write_str(&mut out, name);
            out.push(':');
            match arg {
                Arg::Handle(handle) => write!(out, "{handle}").expect("writing to a String"),
                Arg::Value(value) => write_serde(&mut out, &value(), ty)?,
            }
        }
        out.push('}');
        match (ended, &signature.result) {
            (Ended::Trapped(text), _) => {
                out.push_str(",\"trap\":");
                write_str(&mut out, &text);
            }
            (Ended::Unit, None) => out.push_str(",\"result\":null"),
            (Ended::Returned(value), Some(ty)) => {
                out.push_str(",\"result\":");
                write_serde(&mut out, &value(), ty)?;
            }
            _ => return Err(why("the result does not match the function".into())),
        }
        out.push('}');
        Ok(out)
    })
}

/// The writer yields the CPU to the reconcile loop: on a busy node a trace loses lines (counted)
/// rather than slowing a reconcile. Linux schedules threads by their own nice value.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on the calling thread (its kernel id from gettid) only lowers its
    // scheduling priority; it touches no memory.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    File::create(path)
}

struct Writer {
    shared: Arc<Shared>,
    options: RecordOptions,
    signatures: Signatures,
    file: Option<BufWriter<File>>,
    written: u64,
    seq: u64,
    /// Lines lost: the rest up to the next file is not written.
    discarding: bool,
}

/// How long a writer waits before trying a file that would not open again.
const REOPEN_AFTER: Duration = Duration::from_secs(10);
/// How long written lines may sit in the buffer.
const FLUSH_AFTER: Duration = Duration::from_millis(200);

impl Writer {
    fn run(mut self, rx: Receiver<Item>, mut header: String) {
        loop {
            let item = match rx.recv_timeout(if self.file.is_some() { FLUSH_AFTER } else { REOPEN_AFTER }) {
                Ok(item) => item,
                Err(RecvTimeoutError::Timeout) => {
                    self.flush();
                    if self.file.is_none() {
                        self.reopen(&header);
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            match item {
                Item::Line(encode) => self.write_line(encode),
                Item::Rotate(new_header) => {
                    header = new_header;
                    self.rotate(&header);
                }
                Item::Flush(done) => {
                    self.flush();
                    done.send(()).ok();
                }
            }
        }
        self.flush();
    }

    fn begin(&mut self, file: File, header: &str) {
        self.file = Some(BufWriter::with_capacity(1 << 16, file));
        self.written = 0;
        self.seq = 0;
        self.discarding = false;
        self.shared.stats.files.fetch_add(1, Ordering::Relaxed);
        self.shared.ready.store(true, Ordering::Relaxed);
        self.write_text(header);
    }

    fn reopen(&mut self, header: &str) {
        match open(&self.options.path) {
            Ok(file) => self.begin(file, header),
            Err(error) => {
                self.shared.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(path = %self.options.path.display(), %error, "cannot open the trace file; lines are dropped");
            }
        }
        // What was written before the loss cannot be continued: go on from a state.
        self.shared.broken.store(true, Ordering::Relaxed);
        self.discarding = true;
    }

    fn rotate(&mut self, header: &str) {
        self.flush();
        self.file = None;
        let path = &self.options.path;
        let numbered = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
        if self.options.keep_files == 0 {
            std::fs::remove_file(path).ok();
        } else {
            std::fs::remove_file(numbered(self.options.keep_files)).ok();
            for n in (1..self.options.keep_files).rev() {
                std::fs::rename(numbered(n), numbered(n + 1)).ok();
            }
            std::fs::rename(path, numbered(1)).ok();
        }
        match open(path) {
            Ok(file) => self.begin(file, header),
            Err(error) => {
                self.shared.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                self.shared.ready.store(false, Ordering::Relaxed);
                self.shared.broken.store(true, Ordering::Relaxed);
                tracing::warn!(path = %path.display(), %error, "cannot open the trace file; lines are dropped");
            }
        }
    }

    fn write_line(&mut self, encode: Encode) {
        if self.file.is_none() || self.discarding {
            self.shared.stats.lines_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match encode(&self.signatures, self.seq) {
            Ok(text) => {
                self.seq += 1;
                self.write_text(&text);
            }
            Err(error) => {
                // A value the component's types do not describe: a host bug, never a reason to
                // stop. The trace cannot be replayed past it.
                tracing::error!(%error, "a trace line could not be encoded; the trace goes on from the next state");
                self.lost();
            }
        }
    }

    fn write_text(&mut self, text: &str) {
        let Some(file) = &mut self.file else { return };
        let result = file.write_all(text.as_bytes()).and_then(|()| file.write_all(b"\n"));
        match result {
            Ok(()) => {
                let bytes = text.len() as u64 + 1;
                self.written += bytes;
                self.shared.stats.bytes_written.fetch_add(bytes, Ordering::Relaxed);
                self.shared.stats.lines_written.fetch_add(1, Ordering::Relaxed);
                if self.written >= self.options.max_file_bytes {
                    self.shared.rotate_due.store(true, Ordering::Relaxed);
                }
            }
            Err(error) => {
                self.shared.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(path = %self.options.path.display(), %error, "writing the trace failed; lines are dropped until the next file");
                self.lost();
            }
        }
    }

    fn lost(&mut self) {
        self.shared.stats.lines_dropped.fetch_add(1, Ordering::Relaxed);
        self.shared.broken.store(true, Ordering::Relaxed);
        self.discarding = true;
    }

    fn flush(&mut self) {
        if let Some(file) = &mut self.file
            && let Err(error) = file.flush()
        {
            self.shared.stats.write_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(path = %self.options.path.display(), %error, "writing the trace failed; lines are dropped until the next file");
            self.lost();
        }
    }
}
