//! The state's ordered maps and sets, on one B-tree per key type.
//!
//! Why: `BTreeMap<K, V>` is compiled once per pair of key and value types, and each copy of its
//! insertion, removal and rebalancing code is 8–17 KB of the component. The state had about forty
//! such pairs (a Service's record, a slice's, a lifecycle, a location, a backoff... each keyed
//! by text or by object key), a third of the component's code. A [`Map`] keeps its values in a
//! slab (`Vec`) and its order in a `BTreeMap<K, u32>` from key to slot, so every map and every
//! [`Set`] of one key type shares that one B-tree; what a value type adds is the slab's few
//! small functions. The sets and maps a call builds and drops use them too, keyed by a type
//! the state's maps already have a B-tree for (`&str`, `String`), or are a `VecSet`.
//!
//! Invariant: a [`Map`] orders, compares and serializes exactly like the `BTreeMap` it
//! replaces, and a [`Set`] like the `BTreeSet`: the order of everything the tracker emits and
//! the postcard state format are unchanged (tested below against the std collections). Where a
//! key is repeated in what is read, the last value wins, as `BTreeMap`'s reader has it.
//!
//! The same holds for sorting: `slice::sort_by` is compiled once per element type and
//! comparison (up to 29 KB for one sort of references). [`sort_by`] sorts the positions of the
//! items, `u32`s, with the one sort the component carries, and moves the items after.
//!
//! The slab keeps the slots of removed entries for the next insertion (`free`), so it is never
//! longer than the most entries the map has held at once.

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry as Slot;
use std::fmt;

/// An ordered map whose order lives in the B-tree its key type shares (see the module's doc).
pub struct Map<K, V> {
    index: BTreeMap<K, u32>,
    slots: Vec<Option<V>>,
    free: Vec<u32>,
}

impl<K, V> Default for Map<K, V> {
    fn default() -> Self {
        Self { index: BTreeMap::new(), slots: Vec::new(), free: Vec::new() }
    }
}

/// The value in a slot the index names: such a slot is never empty.
fn full<V>(slot: &Option<V>) -> &V {
    slot.as_ref().expect("the index names only full slots")
}

/// [`full`], to change.
fn full_mut<V>(slot: &mut Option<V>) -> &mut V {
    slot.as_mut().expect("the index names only full slots")
}

/// Empties a slot the index names, giving its value.
fn vacate<V>(slot: &mut Option<V>) -> V {
    slot.take().expect("the index names only full slots")
}

/// The slot `key` names, if any. This, [`index_of`] and [`unindex`] are the index's search,
/// insertion and removal: generic over the key type alone and never inlined, so that every map
/// and set of one key type calls one copy of each (inlined into the maps' methods, they were a
/// copy per value type and per call site; BENCHMARKS.md, "Where the component's bytes go").
#[inline(never)]
fn slot_of<K: Borrow<Q> + Ord, Q: Ord + ?Sized>(index: &BTreeMap<K, u32>, key: &Q) -> Option<u32> {
    index.get(key).copied()
}

/// The slot `key` names, and whether the key is new: a new one names `vacant`, an old one keeps
/// its slot (and the index the key it had).
#[inline(never)]
fn index_of<K: Ord>(index: &mut BTreeMap<K, u32>, key: K, vacant: u32) -> (u32, bool) {
    match index.entry(key) {
        Slot::Occupied(slot) => (*slot.get(), false),
        Slot::Vacant(slot) => (*slot.insert(vacant), true),
    }
}

/// Takes `key` out of the index, giving the slot it named.
#[inline(never)]
fn unindex<K: Borrow<Q> + Ord, Q: Ord + ?Sized>(index: &mut BTreeMap<K, u32>, key: &Q) -> Option<u32> {
    index.remove(key)
}

/// The slot [`park`] fills next.
fn next_slot(len: usize, free: &[u32]) -> u32 {
    match free.last() {
        Some(&at) => at,
        None => u32::try_from(len).expect("a map holds fewer than 2^32 entries"),
    }
}

/// Puts `value` in a free slot, else a new one: the one [`next_slot`] named. A free function,
/// so that it borrows the slab alone (an [`Entry`] holds the map's fields apart).
fn park<V>(slots: &mut Vec<Option<V>>, free: &mut Vec<u32>, value: V) -> u32 {
    match free.pop() {
        Some(at) => {
            slots[at as usize] = Some(value);
            at
        }
        None => {
            let at = next_slot(slots.len(), &[]);
            slots.push(Some(value));
            at
        }
    }
}

impl<K, V> Map<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn clear(&mut self) {
        self.index.clear();
        self.slots.clear();
        self.free.clear();
    }

    fn value(&self, at: u32) -> &V {
        full(&self.slots[at as usize])
    }

    fn value_mut(&mut self, at: u32) -> &mut V {
        full_mut(&mut self.slots[at as usize])
    }

    fn release(&mut self, at: u32) -> V {
        self.free.push(at);
        vacate(&mut self.slots[at as usize])
    }

    pub fn iter(&self) -> Iter<'_, K, V> {
        Iter { index: self.index.iter(), slots: &self.slots }
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator + Clone {
        self.index.keys()
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator + Clone {
        self.iter().map(|(_, value)| value)
    }

    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = (&K, &mut V)> + ExactSizeIterator {
        let slots = self.slots.as_mut_ptr();
        self.index.iter().map(move |(key, &at)| {
            // SAFETY: the index names each slot at most once, so the references handed out are
            // to distinct elements; they borrow `self` mutably for as long as the iterator
            // lives, so the slab is neither read nor moved meanwhile.
            (key, full_mut(unsafe { &mut *slots.add(at as usize) }))
        })
    }

    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.iter_mut().map(|(_, value)| value)
    }
}

impl<K: Ord, V> Map<K, V> {
    pub fn first_key_value(&self) -> Option<(&K, &V)> {
        self.index.first_key_value().map(|(key, &at)| (key, self.value(at)))
    }

    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        slot_of(&self.index, key).map(|at| self.value(at))
    }

    pub fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        let at = slot_of(&self.index, key)?;
        Some(self.value_mut(at))
    }

    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        slot_of(&self.index, key).is_some()
    }

    /// Puts `value` at `key`; returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let (at, new) = index_of(&mut self.index, key, next_slot(self.slots.len(), &self.free));
        if new {
            park(&mut self.slots, &mut self.free, value);
            None
        } else {
            Some(std::mem::replace(self.value_mut(at), value))
        }
    }

    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let at = unindex(&mut self.index, key)?;
        Some(self.release(at))
    }

    pub fn pop_first(&mut self) -> Option<(K, V)> {
        let (key, at) = self.index.pop_first()?;
        Some((key, self.release(at)))
    }

    pub fn pop_last(&mut self) -> Option<(K, V)> {
        let (key, at) = self.index.pop_last()?;
        Some((key, self.release(at)))
    }

    /// The value at `key`, inserted as `make(key)`'s default if missing. Unlike
    /// `entry(key.to_owned())` it makes the key only when it inserts, and an existing key costs
    /// one search of the index: this runs once per endpoint, on the hot path.
    pub fn slot<Q: Ord + ?Sized>(&mut self, key: &Q, make: impl FnOnce(&Q) -> K) -> &mut V
    where
        K: Borrow<Q>,
        V: Default,
    {
        match slot_of(&self.index, key) {
            Some(at) => self.value_mut(at),
            None => self.entry(make(key)).or_default(),
        }
    }

    /// The entry of `key`, to fill if vacant (`or_insert`, `or_insert_with`, `or_default`).
    pub fn entry(&mut self, key: K) -> Entry<'_, K, V> {
        Entry { map: self, key }
    }

    /// Keeps the entries for which `keep` says so, visited in key order.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let slots = &mut self.slots;
        let free = &mut self.free;
        self.index.retain(|key, &mut at| {
            let kept = keep(key, full_mut(&mut slots[at as usize]));
            if !kept {
                slots[at as usize] = None;
                free.push(at);
            }
            kept
        });
    }
}

impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for Map<K, V> {
    type Output = V;
    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no entry for the key")
    }
}

/// [`Map::entry`]: a key and the map it may go in.
pub struct Entry<'a, K, V> {
    map: &'a mut Map<K, V>,
    key: K,
}

impl<'a, K: Ord, V> Entry<'a, K, V> {
    pub fn or_insert_with(self, make: impl FnOnce() -> V) -> &'a mut V {
        let Map { index, slots, free } = self.map;
        let (at, new) = index_of(index, self.key, next_slot(slots.len(), free));
        if new {
            park(slots, free, make());
        }
        full_mut(&mut slots[at as usize])
    }

    pub fn or_insert(self, value: V) -> &'a mut V {
        self.or_insert_with(|| value)
    }

    pub fn or_default(self) -> &'a mut V
    where
        V: Default,
    {
        self.or_insert_with(V::default)
    }
}

impl<K: Clone, V: Clone> Clone for Map<K, V> {
    fn clone(&self) -> Self {
        Self { index: self.index.clone(), slots: self.slots.clone(), free: self.free.clone() }
    }
}

/// Equal when the entries are: where each value sits in the slab is not part of the map.
impl<K: PartialEq, V: PartialEq> PartialEq for Map<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<K: Eq, V: Eq> Eq for Map<K, V> {}

impl<K: PartialEq, V: PartialEq> PartialEq<BTreeMap<K, V>> for Map<K, V> {
    fn eq(&self, other: &BTreeMap<K, V>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for Map<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for Map<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let mut map = Self::new();
        map.extend(entries);
        map
    }
}

impl<K: Ord, V> Extend<(K, V)> for Map<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, entries: I) {
        for (key, value) in entries {
            self.insert(key, value);
        }
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for Map<K, V> {
    fn from(entries: [(K, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<K, V> IntoIterator for Map<K, V> {
    type Item = (K, V);
    type IntoIter = IntoIter<K, V>;
    fn into_iter(self) -> IntoIter<K, V> {
        IntoIter { index: self.index.into_iter(), slots: self.slots }
    }
}

/// [`Map`]'s entries by value, in key order.
pub struct IntoIter<K, V> {
    index: std::collections::btree_map::IntoIter<K, u32>,
    slots: Vec<Option<V>>,
}

impl<K, V> Iterator for IntoIter<K, V> {
    type Item = (K, V);
    fn next(&mut self) -> Option<(K, V)> {
        let (key, at) = self.index.next()?;
        Some((key, vacate(&mut self.slots[at as usize])))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.index.size_hint()
    }
}

impl<'a, K, V> IntoIterator for &'a Map<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;
    fn into_iter(self) -> Iter<'a, K, V> {
        self.iter()
    }
}

/// [`Map::iter`]: the entries by reference, in key order.
pub struct Iter<'a, K, V> {
    index: std::collections::btree_map::Iter<'a, K, u32>,
    slots: &'a [Option<V>],
}

impl<K, V> Clone for Iter<'_, K, V> {
    fn clone(&self) -> Self {
        Self { index: self.index.clone(), slots: self.slots }
    }
}

impl<'a, K, V> Iter<'a, K, V> {
    fn value(&self, at: u32) -> &'a V {
        full(&self.slots[at as usize])
    }
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);
    fn next(&mut self) -> Option<(&'a K, &'a V)> {
        let (key, &at) = self.index.next()?;
        Some((key, self.value(at)))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.index.size_hint()
    }
}

impl<'a, K, V> DoubleEndedIterator for Iter<'a, K, V> {
    fn next_back(&mut self) -> Option<(&'a K, &'a V)> {
        let (key, &at) = self.index.next_back()?;
        Some((key, self.value(at)))
    }
}

impl<K, V> ExactSizeIterator for Iter<'_, K, V> {}

impl<K: Serialize, V: Serialize> Serialize for Map<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Deserialize<'de> for Map<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(Entries { make: Map::of_entries })
    }
}

impl<K: Ord, V> Map<K, V> {
    /// The map of what a state lists, inserted last first. A state lists a map in key order,
    /// and a B-tree node is searched from its smallest key, so an entry smaller than all before
    /// it is placed with one key comparison per level, where in written order it is compared
    /// with every key on its path (~30 comparisons an entry for the thousand-entry maps of a
    /// large cluster). Of a repeated key the value written last is kept, as insertions in
    /// written order would. (`BTreeMap`'s bulk build from a sorted vector would be cheaper
    /// still, but its sort is code per type.)
    fn of_entries(entries: Vec<(K, V)>) -> Self {
        let mut map = Map { index: BTreeMap::new(), slots: Vec::with_capacity(entries.len()), free: Vec::new() };
        for (key, value) in entries.into_iter().rev() {
            if index_of(&mut map.index, key, next_slot(map.slots.len(), &map.free)).1 {
                park(&mut map.slots, &mut map.free, value);
            }
        }
        map
    }
}

/// An ordered set on the B-tree its key type shares with [`Map`] (the slot number unused).
pub struct Set<K>(BTreeMap<K, u32>);

impl<K> Default for Set<K> {
    fn default() -> Self {
        Self(BTreeMap::new())
    }
}

impl<K> Set<K> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator + Clone {
        self.0.keys()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

impl<K: Ord> Set<K> {
    pub fn first(&self) -> Option<&K> {
        self.0.first_key_value().map(|(key, _)| key)
    }

    pub fn last(&self) -> Option<&K> {
        self.0.last_key_value().map(|(key, _)| key)
    }

    pub fn contains<Q: Ord + ?Sized>(&self, member: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        slot_of(&self.0, member).is_some()
    }

    /// Adds `member`; false if it was there (and then the set keeps the one it had).
    pub fn insert(&mut self, member: K) -> bool {
        index_of(&mut self.0, member, 0).1
    }

    pub fn remove<Q: Ord + ?Sized>(&mut self, member: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        unindex(&mut self.0, member).is_some()
    }

    #[inline(never)] // one copy for its many callers (component size, BENCHMARKS.md)
    pub fn take<Q: Ord + ?Sized>(&mut self, member: &Q) -> Option<K>
    where
        K: Borrow<Q>,
    {
        self.0.remove_entry(member).map(|(key, _)| key)
    }

    pub fn pop_first(&mut self) -> Option<K> {
        self.0.pop_first().map(|(key, _)| key)
    }

    pub fn pop_last(&mut self) -> Option<K> {
        self.0.pop_last().map(|(key, _)| key)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.0.retain(|key, _| keep(key));
    }

    /// The members of `self` not in `other`, in order.
    pub fn difference<'a>(&'a self, other: &'a Self) -> impl Iterator<Item = &'a K> + 'a {
        self.iter().filter(move |member| !other.contains(*member))
    }
}

impl<K: Clone> Clone for Set<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K: PartialEq> PartialEq for Set<K> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<K: Eq> Eq for Set<K> {}

impl<K: PartialEq> PartialEq<std::collections::BTreeSet<K>> for Set<K> {
    fn eq(&self, other: &std::collections::BTreeSet<K>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<K: fmt::Debug> fmt::Debug for Set<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl<K: Ord> FromIterator<K> for Set<K> {
    fn from_iter<I: IntoIterator<Item = K>>(members: I) -> Self {
        let mut set = Self::new();
        set.extend(members);
        set
    }
}

impl<K: Ord> Extend<K> for Set<K> {
    fn extend<I: IntoIterator<Item = K>>(&mut self, members: I) {
        for member in members {
            self.insert(member);
        }
    }
}

impl<K: Ord, const N: usize> From<[K; N]> for Set<K> {
    fn from(members: [K; N]) -> Self {
        members.into_iter().collect()
    }
}

impl<K> IntoIterator for Set<K> {
    type Item = K;
    type IntoIter = std::collections::btree_map::IntoKeys<K, u32>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_keys()
    }
}

impl<'a, K> IntoIterator for &'a Set<K> {
    type Item = &'a K;
    type IntoIter = std::collections::btree_map::Keys<'a, K, u32>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.keys()
    }
}

impl<K: Serialize> Serialize for Set<K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de, K: Deserialize<'de> + Ord> Deserialize<'de> for Set<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Last first, as `Map::of_entries` and for its reason.
        deserializer.deserialize_seq(Members { make: |members: Vec<K>| members.into_iter().rev().collect() })
    }
}

/// Room to make for a collection the state says has `len` members: all of it (growing by
/// doubling costs a copy per step), up to a bound, since a corrupt state can claim any length.
pub(crate) fn preallocation(len: Option<usize>) -> usize {
    len.unwrap_or(0).min(4_096)
}

/// Reads a sequence's members in the order they were written, then makes the set of them.
pub(crate) struct Members<B, C> {
    pub(crate) make: fn(B) -> C,
}

impl<'de, B: Buffer, C> Visitor<'de> for Members<B, C>
where
    B::Item: Deserialize<'de>,
{
    type Value = C;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a set")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<C, A::Error> {
        let mut members = B::with_capacity(preallocation(seq.size_hint()));
        while let Some(member) = seq.next_element()? {
            members.push(member);
        }
        Ok((self.make)(members))
    }
}

/// Reads a map's entries in the order they were written, then makes the map of them.
pub(crate) struct Entries<B, C> {
    pub(crate) make: fn(B) -> C,
}

impl<'de, K: Deserialize<'de>, V: Deserialize<'de>, B: Buffer<Item = (K, V)>, C> Visitor<'de> for Entries<B, C> {
    type Value = C;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<C, A::Error> {
        let mut entries = B::with_capacity(preallocation(map.size_hint()));
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok((self.make)(entries))
    }
}

/// Where [`Members`] and [`Entries`] put what they read, in the order it was written: a `Vec`
/// for the keyed collections (a `Vec`'s growth is one copy of code for every item type, a
/// `SmallVec`'s one per type), a `SmallVec` for `VecSet` and `VecMap`, which keep it.
pub(crate) trait Buffer {
    type Item;
    fn with_capacity(capacity: usize) -> Self;
    fn push(&mut self, item: Self::Item);
}

impl<T> Buffer for Vec<T> {
    type Item = T;
    fn with_capacity(capacity: usize) -> Self {
        Vec::with_capacity(capacity)
    }
    fn push(&mut self, item: T) {
        Vec::push(self, item);
    }
}

impl<T> Buffer for SmallVec<[T; 1]> {
    type Item = T;
    fn with_capacity(capacity: usize) -> Self {
        SmallVec::with_capacity(capacity)
    }
    fn push(&mut self, item: T) {
        SmallVec::push(self, item);
    }
}

/// Sorts `items` by `order`, stably, as `slice::sort_by` does (see the module's doc for why).
pub fn sort_by<T>(items: &mut [T], mut order: impl FnMut(&T, &T) -> Ordering) {
    if items.windows(2).all(|pair| order(&pair[0], &pair[1]) != Ordering::Greater) {
        return;
    }
    let mut from = sorted_positions(items.len(), &mut |a, b| order(&items[a], &items[b]));
    // `from[i]` is where the item that goes to `i` is now: follow each cycle, swapping.
    const PLACED: u32 = u32::MAX;
    for start in 0..from.len() {
        let mut at = start;
        loop {
            let next = from[at];
            if next == PLACED {
                break;
            }
            from[at] = PLACED;
            if next as usize == start {
                break;
            }
            items.swap(at, next as usize);
            at = next as usize;
        }
    }
}

/// Sorts `items` by their order, stably.
pub fn sort<T: Ord>(items: &mut [T]) {
    sort_by(items, T::cmp);
}

/// The positions `0..len` in the order `order` gives them. Not generic, so its sort is the one
/// the component carries.
fn sorted_positions(len: usize, order: &mut dyn FnMut(usize, usize) -> Ordering) -> Vec<u32> {
    let len = u32::try_from(len).expect("fewer than 2^32 items are sorted");
    let mut positions: Vec<u32> = (0..len).collect();
    positions.sort_by(|&a, &b| order(a as usize, b as usize));
    positions
}

// By path, so that it resolves the same where `tests/next-guest` includes this file by path.
#[cfg(test)]
#[path = "keyed/tests.rs"]
mod tests;
