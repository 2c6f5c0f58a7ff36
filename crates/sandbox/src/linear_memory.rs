//! Guest linear memories that are recycled instead of unmapped (Unix).
//!
//! A fresh instance's memory starts as untouched address space: each 4 KiB page the guest
//! writes first costs a page fault, and dropping the instance hands every page back to the
//! kernel. For a swap this is most of the kernel's share of the time: importing the 1,000-node
//! cluster's state touches ~30 MB (~7,500 faults), and the old version's memory is unmapped
//! right after the switch. [`RecyclingMemories`] keeps a few dropped memories instead: a
//! background thread zeroes the pages the guest could reach and makes them inaccessible again,
//! and the next instance takes the region with its pages still resident, so its growth is an
//! `mprotect` and no faults.
//!
//! Invariants, as wasmtime requires of a `MemoryCreator` (its guard-page bounds-check elision
//! relies on them):
//! * exactly `byte_size` bytes (rounded up to the host page) are accessible; the rest of the
//!   reservation and the guard after it fault;
//! * the base never moves: the whole reservation is mapped up front, growth only opens pages;
//! * a memory handed out reads as zeroes: a recycled region is zeroed over every byte a guest
//!   could reach before it is handed out again, and is never handed to two memories at once.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, Weak};
use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

/// Zeroed regions kept for the next instances. Two: a swap needs one while the old version
/// still holds its own.
const KEPT_REGIONS: usize = 2;
/// Regions with more resident than this are unmapped rather than kept: a guest that grew to a
/// large memory cap (or a memory bomb stopped at it) does not pin that much for good.
const KEPT_BYTES_PER_REGION: usize = 256 << 20;

/// Counts of what the creator did, for `/metrics` and the benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Memories given a freshly mapped region.
    pub mapped: u64,
    /// Memories given a recycled (resident, zeroed) region.
    pub recycled: u64,
    /// Bytes zeroed on the background thread.
    pub zeroed_bytes: u64,
    /// Regions unmapped (too many or too large to keep).
    pub unmapped: u64,
}

/// The engine's memory creator; see the module documentation.
pub struct RecyclingMemories {
    shared: Arc<Shared>,
}

struct Shared {
    /// Zeroed, inaccessible regions ready to hand out.
    clean: Mutex<Vec<Region>>,
    /// Dropped regions on their way to the zeroing thread, started at the first drop.
    dirty: Mutex<Option<Sender<Region>>>,
    mapped: AtomicU64,
    recycled: AtomicU64,
    zeroed_bytes: AtomicU64,
    unmapped: AtomicU64,
}

/// One mapping: `reservation` bytes for the memory and `guard` bytes after it.
struct Region {
    base: NonNull<u8>,
    reservation: usize,
    guard: usize,
    /// Bytes from `base` that are readable and writable now.
    accessible: usize,
    /// Bytes from `base` whose pages are resident (populated when opened, kept when closed);
    /// those past `accessible` are zero.
    resident: usize,
}

// SAFETY: a region is owned by one memory, one queue or one list at a time; the mapping is
// process-wide.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn round_up(bytes: usize, page: usize) -> usize {
    bytes.div_ceil(page) * page
}

fn last_os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

impl Region {
    fn map(reservation: usize, guard: usize) -> Result<Self, String> {
        let len = reservation.checked_add(guard).ok_or("memory reservation overflows")?;
        // SAFETY: a fresh anonymous mapping, touching no existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(last_os_error("reserving a guest memory"));
        }
        let base = NonNull::new(base.cast()).ok_or("mmap returned null")?;
        Ok(Self { base, reservation, guard, accessible: 0, resident: 0 })
    }

    /// Makes `[0, bytes)` accessible, `bytes` a page multiple within the reservation.
    fn open_to(&mut self, bytes: usize) -> Result<(), String> {
        if bytes <= self.accessible {
            return Ok(());
        }
        // SAFETY: the range lies inside this region's mapping.
        let status = unsafe {
            libc::mprotect(
                self.base.as_ptr().add(self.accessible).cast(),
                bytes - self.accessible,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if status != 0 {
            return Err(last_os_error("opening guest memory pages"));
        }
        self.accessible = bytes;
        #[cfg(target_os = "linux")]
        if bytes > self.resident {
            // One call faults the new pages in, not one trap per page as the guest first writes
            // each (a fresh instance's import ~15% faster). Only an optimization: a kernel
            // without MADV_POPULATE_WRITE (before 5.14) faults them in on first touch.
            // SAFETY: the range lies inside this region's mapping and is read-write.
            unsafe {
                libc::madvise(
                    self.base.as_ptr().add(self.resident).cast(),
                    bytes - self.resident,
                    libc::MADV_POPULATE_WRITE,
                )
            };
        }
        self.resident = self.resident.max(bytes);
        Ok(())
    }

    /// Zeroes what was accessible and closes it again; the pages stay resident.
    fn scrub(&mut self) -> Result<usize, String> {
        let zeroed = self.accessible;
        // SAFETY: `[0, accessible)` is mapped read-write and owned by this region alone.
        unsafe { std::ptr::write_bytes(self.base.as_ptr(), 0, zeroed) };
        // SAFETY: as above.
        let status = unsafe { libc::mprotect(self.base.as_ptr().cast(), zeroed, libc::PROT_NONE) };
        if status != 0 {
            return Err(last_os_error("closing guest memory pages"));
        }
        self.accessible = 0;
        Ok(zeroed)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.reservation + self.guard) };
    }
}

impl RecyclingMemories {
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                clean: Mutex::new(Vec::new()),
                dirty: Mutex::new(None),
                mapped: AtomicU64::new(0),
                recycled: AtomicU64::new(0),
                zeroed_bytes: AtomicU64::new(0),
                unmapped: AtomicU64::new(0),
            }),
        }
    }

    pub fn stats(&self) -> MemoryStats {
        self.shared.stats()
    }
}

impl Default for RecyclingMemories {
    fn default() -> Self {
        Self::new()
    }
}

impl Shared {
    fn stats(&self) -> MemoryStats {
        MemoryStats {
            mapped: self.mapped.load(Ordering::Relaxed),
            recycled: self.recycled.load(Ordering::Relaxed),
            zeroed_bytes: self.zeroed_bytes.load(Ordering::Relaxed),
            unmapped: self.unmapped.load(Ordering::Relaxed),
        }
    }

    fn take(&self, reservation: usize, guard: usize) -> Result<Region, String> {
        let mut clean = self.clean.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = clean.iter().position(|r| r.reservation == reservation && r.guard == guard) {
            self.recycled.fetch_add(1, Ordering::Relaxed);
            return Ok(clean.swap_remove(at));
        }
        drop(clean);
        self.mapped.fetch_add(1, Ordering::Relaxed);
        Region::map(reservation, guard)
    }

    /// Hands a dropped memory's region to the zeroing thread (started on first use).
    fn give_back(self: &Arc<Self>, region: Region) {
        if region.resident > KEPT_BYTES_PER_REGION {
            self.unmapped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut dirty = self.dirty.lock().unwrap_or_else(|e| e.into_inner());
        let sender = match &*dirty {
            Some(sender) => sender.clone(),
            None => match self.start_zeroing() {
                Some(sender) => dirty.insert(sender).clone(),
                None => {
                    self.unmapped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            },
        };
        drop(dirty);
        if sender.send(region).is_err() {
            self.unmapped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn start_zeroing(self: &Arc<Self>) -> Option<Sender<Region>> {
        let (sender, regions) = channel::<Region>();
        let shared: Weak<Shared> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("clb-memzero".into()).spawn(move || {
            while let Ok(mut region) = regions.recv() {
                let Some(shared) = shared.upgrade() else { break };
                match region.scrub() {
                    Ok(zeroed) => {
                        shared.zeroed_bytes.fetch_add(zeroed as u64, Ordering::Relaxed);
                        let mut clean = shared.clean.lock().unwrap_or_else(|e| e.into_inner());
                        if clean.len() < KEPT_REGIONS {
                            clean.push(region);
                            continue;
                        }
                    }
                    Err(error) => tracing::warn!(%error, "a guest memory could not be recycled; unmapping it"),
                }
                shared.unmapped.fetch_add(1, Ordering::Relaxed);
            }
        });
        match spawned {
            Ok(_) => Some(sender),
            Err(error) => {
                tracing::warn!(%error, "no thread to recycle guest memories; unmapping them instead");
                None
            }
        }
    }
}

/// A linear memory over one region.
struct RecycledMemory {
    region: Option<Region>,
    byte_size: usize,
    page: usize,
    shared: Arc<Shared>,
}

impl RecycledMemory {
    fn region(&self) -> &Region {
        self.region.as_ref().expect("a live memory holds its region")
    }
}

// SAFETY: the region stays mapped at the same base for the memory's life, exactly
// `round_up(byte_size)` bytes of it accessible, the rest of the reservation and the guard not.
unsafe impl LinearMemory for RecycledMemory {
    fn byte_size(&self) -> usize {
        self.byte_size
    }

    fn byte_capacity(&self) -> usize {
        self.region().reservation
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        let page = self.page;
        let region = self.region.as_mut().expect("a live memory holds its region");
        if new_size > region.reservation {
            wasmtime::bail!("guest memory of {new_size} bytes exceeds its reservation of {}", region.reservation);
        }
        region.open_to(round_up(new_size, page)).map_err(wasmtime::Error::msg)?;
        self.byte_size = new_size;
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.region().base.as_ptr()
    }
}

impl Drop for RecycledMemory {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            self.shared.give_back(region);
        }
    }
}

// SAFETY: every memory is zero-filled, keeps its base and honours the reservation and the
// guard asked for (see `RecycledMemory`).
unsafe impl MemoryCreator for RecyclingMemories {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        let page = page_size();
        let reservation = match reserved_size_in_bytes {
            Some(bytes) => bytes,
            None => round_up(maximum.unwrap_or(minimum).max(minimum), page),
        };
        if minimum > reservation {
            return Err(format!("guest memory of {minimum} bytes exceeds its reservation of {reservation}"));
        }
        let mut region = self.shared.take(reservation, guard_size_in_bytes)?;
        if let Err(error) = region.open_to(round_up(minimum, page)) {
            self.shared.give_back(region);
            return Err(error);
        }
        Ok(Box::new(RecycledMemory { region: Some(region), byte_size: minimum, page, shared: self.shared.clone() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const WASM_PAGE: usize = 64 << 10;
    const RESERVATION: usize = 1 << 30;
    const GUARD: usize = 2 << 20;

    fn memory(creator: &RecyclingMemories, pages: usize) -> Box<dyn LinearMemory> {
        creator
            .new_memory(MemoryType::new(pages as u32, None), pages * WASM_PAGE, None, Some(RESERVATION), GUARD)
            .unwrap()
    }

    /// Waits until the zeroing thread has taken back `regions` regions in all (kept or not).
    fn settled(creator: &RecyclingMemories, regions: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let kept = creator.shared.clean.lock().unwrap().len();
            if kept + creator.stats().unmapped as usize >= regions {
                return;
            }
            assert!(Instant::now() < deadline, "the zeroing thread took back {kept} of {regions} regions");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn fill(memory: &dyn LinearMemory, byte: u8) {
        // SAFETY: the memory's `byte_size` bytes are accessible and owned by this test.
        unsafe { std::ptr::write_bytes(memory.as_ptr(), byte, memory.byte_size()) };
    }

    fn bytes(memory: &dyn LinearMemory) -> &[u8] {
        // SAFETY: as in `fill`.
        unsafe { std::slice::from_raw_parts(memory.as_ptr(), memory.byte_size()) }
    }

    #[test]
    fn a_recycled_memory_reads_as_zeroes_where_the_last_guest_wrote() {
        let creator = RecyclingMemories::new();
        let mut first = memory(&creator, 1);
        first.grow_to(4 * WASM_PAGE).unwrap();
        fill(&*first, 0xab);
        let base = first.as_ptr();
        drop(first);
        settled(&creator, 1);

        let mut second = memory(&creator, 1);
        assert_eq!(second.as_ptr(), base, "the region is reused");
        assert_eq!(second.byte_size(), WASM_PAGE, "a recycled memory starts at its minimum");
        second.grow_to(5 * WASM_PAGE).unwrap();
        assert!(bytes(&*second).iter().all(|&b| b == 0), "no byte of the last guest shows through");
        let stats = creator.stats();
        assert_eq!((stats.mapped, stats.recycled, stats.unmapped), (1, 1, 0));
        assert_eq!(stats.zeroed_bytes, 4 * WASM_PAGE as u64);
    }

    /// The permissions of the mapping holding `address`, from `/proc/self/maps`.
    #[cfg(target_os = "linux")]
    fn permissions_at(address: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for line in maps.lines() {
            let mut fields = line.split_whitespace();
            let (range, permissions) = (fields.next().unwrap(), fields.next().unwrap());
            let (start, end) = range.split_once('-').unwrap();
            let (start, end) = (usize::from_str_radix(start, 16).unwrap(), usize::from_str_radix(end, 16).unwrap());
            if (start..end).contains(&address) {
                return permissions.to_owned();
            }
        }
        panic!("{address:#x} is not mapped")
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_the_memory_s_size_is_accessible_the_rest_of_the_reservation_and_the_guard_are_not() {
        let creator = RecyclingMemories::new();
        let first = memory(&creator, 3);
        fill(&*first, 1);
        drop(first);
        settled(&creator, 1);
        // A recycled region opened to less than it held before closes the rest again.
        let mut memory = memory(&creator, 1);
        let base = memory.as_ptr() as usize;
        for (size, what) in [(WASM_PAGE, "at its minimum"), (2 * WASM_PAGE + 100, "grown to a size off the page")] {
            memory.grow_to(size).unwrap();
            let open = size.div_ceil(page_size()) * page_size();
            assert_eq!(permissions_at(base), "rw-p", "{what}");
            assert_eq!(permissions_at(base + open - 1), "rw-p", "{what}");
            assert_eq!(permissions_at(base + open), "---p", "{what}: the first byte past the memory");
            assert_eq!(permissions_at(base + RESERVATION + GUARD - 1), "---p", "{what}: the guard's last byte");
        }
    }

    #[test]
    fn growth_past_the_reservation_is_refused_and_the_memory_keeps_its_size() {
        let creator = RecyclingMemories::new();
        let mut memory = memory(&creator, 1);
        let error = memory.grow_to(RESERVATION + WASM_PAGE).unwrap_err();
        assert!(error.to_string().contains("exceeds its reservation"), "{error}");
        assert_eq!(memory.byte_size(), WASM_PAGE);
        assert_eq!(memory.byte_capacity(), RESERVATION);
    }

    #[test]
    fn no_more_than_the_kept_number_of_regions_stay_mapped() {
        let creator = RecyclingMemories::new();
        let memories: Vec<_> = (0..KEPT_REGIONS + 1).map(|_| memory(&creator, 1)).collect();
        drop(memories);
        settled(&creator, KEPT_REGIONS + 1);
        assert_eq!(creator.shared.clean.lock().unwrap().len(), KEPT_REGIONS);
        assert_eq!(creator.stats().unmapped, 1);
    }

    #[test]
    fn a_region_that_held_more_than_the_kept_size_is_unmapped_not_kept() {
        let creator = RecyclingMemories::new();
        let mut large = memory(&creator, 1);
        large.grow_to(KEPT_BYTES_PER_REGION + WASM_PAGE).unwrap();
        drop(large);
        settled(&creator, 1);
        assert!(creator.shared.clean.lock().unwrap().is_empty());
        assert_eq!(creator.stats().unmapped, 1);
    }
}
