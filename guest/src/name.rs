//! Compact keys for the tracker's state: the text of IPs, UIDs and node names without a heap
//! allocation each, and sorted-vector collections for the inner levels of its nested maps (the
//! identities at one address, the addresses at one location), held in place while they have
//! one member.
//!
//! Why: the state of a 30,000-pod cluster names every pod's address, location and Service
//! several times over. As `String`s in `BTreeMap`s that was ~350,000 allocations and ~180,000
//! ordered insertions on every `import-state`, which dominated a hot swap's state move. A [`Name`]
//! keeps up to [`Name::INLINE`] bytes in place — every canonical IPv4 text, every UID, nearly
//! every IPv6 text and node name — and only longer text on the heap. A [`VecMap`] or [`VecSet`]
//! is read from a state by pushing entries in the order they were written, with no search; the
//! price is an insertion that moves the entries after it, which stays small because these
//! collections are the inner levels (a location's addresses, not the cluster's).
//!
//! The state's outer maps and sets are [`crate::keyed`]'s; everything here is read with its visitors.
//!
//! Invariant: each type here orders, compares and serializes exactly like the collection it
//! replaces (`String`, `BTreeMap<K, V>`, `BTreeSet<T>`), so the order of everything the tracker
//! emits and the postcard state format are unchanged: state version 1 reads and writes the same
//! bytes as before.

use crate::keyed::{Entries, Members};
use serde::de::Visitor;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::ops::Deref;

/// Immutable text, in place when short. Orders like `str`.
#[derive(Clone)]
pub struct Name(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; Name::INLINE] },
    Heap(Box<str>),
}

impl Name {
    /// The longest text kept in place: a UID is 36 bytes, an IPv6 text at most 39 (and 38 or
    /// less unless none of its eight groups is zero), with the length this makes `Name` 40 bytes.
    pub const INLINE: usize = 38;

    #[inline(never)] // one copy for its many callers (component size, BENCHMARKS.md)
    pub fn new(text: &str) -> Self {
        if text.len() <= Self::INLINE {
            let mut bytes = [0; Self::INLINE];
            bytes[..text.len()].copy_from_slice(text.as_bytes());
            Self(Repr::Inline { len: text.len() as u8, bytes })
        } else {
            Self(Repr::Heap(text.into()))
        }
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            // SAFETY: the bytes were copied from a `&str` whole (`new` is the only constructor),
            // so they are valid UTF-8.
            Repr::Inline { len, bytes } => unsafe { std::str::from_utf8_unchecked(&bytes[..usize::from(*len)]) },
            Repr::Heap(text) => text,
        }
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Name {}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl From<&str> for Name {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl From<&String> for Name {
    fn from(text: &String) -> Self {
        Self::new(text)
    }
}

impl From<String> for Name {
    #[inline(never)] // one copy for its many callers (component size, BENCHMARKS.md)
    fn from(text: String) -> Self {
        if text.len() <= Self::INLINE { Self::new(&text) } else { Self(Repr::Heap(text.into_boxed_str())) }
    }
}

impl From<Name> for String {
    #[inline(never)] // one copy for its many callers (component size, BENCHMARKS.md)
    fn from(name: Name) -> Self {
        match name.0 {
            Repr::Heap(text) => text.into_string(),
            Repr::Inline { .. } => name.as_str().to_owned(),
        }
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl Visitor<'_> for Text {
            type Value = Name;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Name, E> {
                Ok(Name::new(text))
            }
            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Name, E> {
                Ok(Name::from(text))
            }
            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Name, E> {
                let text = ascii(bytes).or_else(|| std::str::from_utf8(bytes).ok());
                text.map(Name::new).ok_or_else(|| E::invalid_value(serde::de::Unexpected::Bytes(bytes), &self))
            }
        }
        // Read as bytes and checked here: postcard writes a string as its length and bytes, so
        // this reads what `serialize_str` wrote, and the keys are ASCII, which `ascii` checks a
        // word at a time (the general UTF-8 check, a few bytes a step, was ~7% of a native import).
        // Self-describing formats hand over a string and take the `visit_str` path.
        deserializer.deserialize_bytes(Text)
    }
}

/// The bytes as text when they are all ASCII, checked eight at a time.
fn ascii(bytes: &[u8]) -> Option<&str> {
    let (words, rest) = bytes.as_chunks::<8>();
    let high = words.iter().fold(0, |acc, w| acc | u64::from_ne_bytes(*w)) & 0x8080_8080_8080_8080;
    // SAFETY: ASCII is UTF-8.
    (high == 0 && rest.is_ascii()).then(|| unsafe { std::str::from_utf8_unchecked(bytes) })
}

/// A set kept as a sorted vector, in place while it holds one member. Serializes as a sequence
/// in order, like `BTreeSet`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VecSet<T>(SmallVec<[T; 1]>);

impl<T> Default for VecSet<T> {
    fn default() -> Self {
        Self(SmallVec::new())
    }
}

impl<T: Ord> VecSet<T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    fn position<Q: Ord + ?Sized>(&self, member: &Q) -> Result<usize, usize>
    where
        T: Borrow<Q>,
    {
        self.0.binary_search_by(|m| m.borrow().cmp(member))
    }

    pub fn contains<Q: Ord + ?Sized>(&self, member: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        self.position(member).is_ok()
    }

    /// Adds `member`; false if it was there.
    pub fn insert(&mut self, member: T) -> bool {
        // Members often come in order (a list does): then one comparison, with the last.
        if self.0.last().is_none_or(|last| *last < member) {
            self.0.push(member);
            return true;
        }
        match self.position(&member) {
            Ok(_) => false,
            Err(at) => {
                self.0.insert(at, member);
                true
            }
        }
    }

    /// Removes `member`; false if it was not there.
    pub fn remove<Q: Ord + ?Sized>(&mut self, member: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        match self.position(member) {
            Ok(at) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    /// The members of `self` not in `other`, in order.
    pub fn difference<'a>(&'a self, other: &'a Self) -> impl Iterator<Item = &'a T> + 'a {
        self.0.iter().filter(move |m| !other.contains(*m))
    }
}

impl<T: Ord> VecSet<T> {
    /// The set of `members` in any order (sorted only when they are not already).
    fn of_members(mut members: SmallVec<[T; 1]>) -> Self {
        if !members.windows(2).all(|w| w[0] < w[1]) {
            crate::keyed::sort(&mut members);
            members.dedup();
        }
        Self(members)
    }
}

impl<T: Ord> FromIterator<T> for VecSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(members: I) -> Self {
        Self::of_members(members.into_iter().collect())
    }
}

impl<T: Ord> Extend<T> for VecSet<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, members: I) {
        for member in members {
            self.insert(member);
        }
    }
}

impl<'a, T> IntoIterator for &'a VecSet<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T> IntoIterator for VecSet<T> {
    type Item = T;
    type IntoIter = smallvec::IntoIter<[T; 1]>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<T: Serialize> Serialize for VecSet<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter())
    }
}

impl<'de, T: Deserialize<'de> + Ord> Deserialize<'de> for VecSet<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Written in order; a state that is not (hand-made or corrupt) is put in order.
        deserializer.deserialize_seq(Members { make: VecSet::of_members })
    }
}

/// A map kept as a vector sorted by key, in place while it holds one entry. Serializes as a map
/// in key order, like `BTreeMap`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VecMap<K, V>(SmallVec<[(K, V); 1]>);

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        Self(SmallVec::new())
    }
}

impl<K: Ord, V> VecMap<K, V> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    fn position<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// [`Self::position`] for an insertion: past the last key first, where keys that come in
    /// order (as a list's do) go, with one comparison.
    fn place<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        match self.0.last() {
            Some((last, _)) if last.borrow() < key => Err(self.0.len()),
            _ => self.position(key),
        }
    }

    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.position(key).ok().map(|at| &self.0[at].1)
    }

    pub fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.position(key).ok().map(|at| &mut self.0[at].1)
    }

    /// The value at `key`, inserted as `make(key)`'s default if missing.
    pub fn slot<Q: Ord + ?Sized>(&mut self, key: &Q, make: impl FnOnce(&Q) -> K) -> &mut V
    where
        K: Borrow<Q>,
        V: Default,
    {
        let at = match self.place(key) {
            Ok(at) => at,
            Err(at) => {
                self.0.insert(at, (make(key), V::default()));
                at
            }
        };
        &mut self.0[at].1
    }

    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.position(key).is_ok()
    }

    /// Puts `value` at `key`; returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.place(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at].1, value)),
            Err(at) => {
                self.0.insert(at, (key, value));
                None
            }
        }
    }

    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.position(key).ok().map(|at| self.0.remove(at).1)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<K: Ord, V> VecMap<K, V> {
    /// The map of `entries` in any order: as `BTreeMap` would build it, the last value of a
    /// repeated key wins.
    fn of_entries(mut entries: SmallVec<[(K, V); 1]>) -> Self {
        if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
            entries.reverse();
            crate::keyed::sort_by(&mut entries, |a, b| a.0.cmp(&b.0));
            entries.dedup_by(|later, kept| later.0 == kept.0);
        }
        Self(entries)
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for VecMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        Self::of_entries(entries.into_iter().collect())
    }
}

impl<K: Ord, V> Extend<(K, V)> for VecMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, entries: I) {
        for (key, value) in entries {
            self.insert(key, value);
        }
    }
}

impl<K, V> IntoIterator for VecMap<K, V> {
    type Item = (K, V);
    type IntoIter = smallvec::IntoIter<[(K, V); 1]>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, K, V> IntoIterator for &'a VecMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<K: Serialize, V: Serialize> Serialize for VecMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Deserialize<'de> for VecMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Written in order; a state that is not (hand-made or corrupt) is read as a `BTreeMap`
        // would read it.
        deserializer.deserialize_map(Entries { make: VecMap::of_entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn a_name_is_forty_bytes_and_keeps_uids_and_ipv4_text_in_place() {
        assert_eq!(std::mem::size_of::<Name>(), 40);
        for text in ["0f6f2c2e-1b1a-4a7e-9c61-3f0b0c1d2e01", "255.255.255.255", "fd00:1234:5678:9abc:def0:1234:5678:0"]
        {
            assert!(matches!(Name::new(text).0, Repr::Inline { .. }), "{text}");
        }
        let long = "a".repeat(Name::INLINE + 1);
        assert!(matches!(Name::new(&long).0, Repr::Heap(_)));
        assert_eq!(Name::new(&long), long);
    }

    #[test]
    fn names_order_and_serialize_exactly_like_strings() {
        let texts = ["10.0.0.10", "10.0.0.2", "", "b", "a".repeat(50).as_str(), "é", "10.0.0.1"].map(str::to_owned);
        let strings: BTreeSet<String> = texts.iter().cloned().collect();
        let names: BTreeSet<Name> = texts.iter().map(Name::from).collect();
        assert!(strings.iter().eq(names.iter().map(Name::as_str)));
        assert_eq!(postcard::to_allocvec(&strings).unwrap(), postcard::to_allocvec(&names).unwrap());
        let back: BTreeSet<Name> = postcard::from_bytes(&postcard::to_allocvec(&strings).unwrap()).unwrap();
        assert_eq!(back, names);
    }

    #[test]
    fn names_read_non_ascii_text_and_refuse_bytes_that_are_not_utf8() {
        for text in ["10.0.0.1", "ünïcödé-node-name", "ノード", "a-name-longer-than-thirty-eight-bytes-in-ascii"]
        {
            let bytes = postcard::to_allocvec(text).unwrap();
            assert_eq!(postcard::from_bytes::<Name>(&bytes).unwrap(), text);
        }
        assert!(postcard::from_bytes::<Name>(&serde_bytes_like(&[0x61, 0xff, 0x62])).is_err());
    }

    /// Bytes written as postcard writes a string: the length, then the bytes.
    fn serde_bytes_like(bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn small_collections_serialize_exactly_like_btree_collections() {
        let set: BTreeSet<String> = ["c", "a", "b"].map(str::to_owned).into();
        let vec_set: VecSet<Name> = ["b", "c", "a", "a"].into_iter().map(Name::from).collect();
        assert_eq!(postcard::to_allocvec(&set).unwrap(), postcard::to_allocvec(&vec_set).unwrap());
        let map: BTreeMap<String, u32> = [("y".to_owned(), 2), ("x".to_owned(), 1)].into();
        let mut vec_map: VecMap<Name, u32> = VecMap::default();
        *vec_map.slot("y", Name::new) += 2;
        *vec_map.slot("x", Name::new) += 1;
        let bytes = postcard::to_allocvec(&map).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&vec_map).unwrap());
        assert_eq!(postcard::from_bytes::<VecMap<Name, u32>>(&bytes).unwrap(), vec_map);
    }

    #[test]
    fn small_collections_read_out_of_order_input_as_btree_collections_would() {
        let unordered = postcard::to_allocvec(&vec!["b", "a", "b"]).unwrap();
        let set: VecSet<Name> = postcard::from_bytes(&unordered).unwrap();
        assert!(set.iter().map(Name::as_str).eq(["a", "b"]));
        let entries = postcard::to_allocvec(&vec![("b", 1u32), ("a", 2), ("b", 3)]).unwrap();
        let as_btree: BTreeMap<String, u32> = postcard::from_bytes(&entries).unwrap();
        let as_vec: VecMap<Name, u32> = postcard::from_bytes(&entries).unwrap();
        assert!(as_btree.iter().map(|(k, v)| (k.as_str(), *v)).eq(as_vec.iter().map(|(k, v)| (k.as_str(), *v))));
    }

    #[test]
    fn state_maps_and_sets_built_at_once_read_any_input_as_insertions_would() {
        #[derive(Deserialize)]
        struct Bulk {
            map: crate::keyed::Map<String, u32>,
            set: VecSet<String>,
            keyed_set: crate::keyed::Set<String>,
        }
        #[derive(Deserialize, PartialEq, Debug)]
        struct Inserted {
            map: BTreeMap<String, u32>,
            set: BTreeSet<String>,
        }
        let many: Vec<String> = (0..300).map(|i| format!("key-{i:03}")).collect();
        let inputs = [
            (many.iter().map(|k| (k.as_str(), 1u32)).collect::<Vec<_>>(), many.iter().map(String::as_str).collect()),
            (vec![("b", 1), ("a", 2), ("b", 3), ("c", 4), ("a", 5)], vec!["b", "a", "b"]),
            (many.iter().rev().map(|k| (k.as_str(), 7)).collect(), many.iter().rev().map(String::as_str).collect()),
            (Vec::new(), Vec::<&str>::new()),
        ];
        for (entries, members) in inputs {
            let bytes = postcard::to_allocvec(&(&entries, &members, &members)).unwrap();
            let bulk: Bulk = postcard::from_bytes(&bytes).unwrap();
            let inserted: Inserted = postcard::from_bytes(&bytes).unwrap();
            assert!(bulk.keyed_set == inserted.set, "{members:?}");
            let map = bulk.map.into_iter().collect();
            assert_eq!(Inserted { map, set: bulk.set.into_iter().collect() }, inserted, "{entries:?}");
        }
    }

    #[test]
    fn set_operations_keep_members_sorted_and_unique() {
        let mut set = VecSet::new();
        for m in ["m", "a", "z", "a"] {
            set.insert(Name::new(m));
        }
        assert!(set.iter().map(Name::as_str).eq(["a", "m", "z"]));
        assert!(set.remove("m") && !set.remove("m"));
        let other: VecSet<Name> = ["z"].into_iter().map(Name::from).collect();
        assert!(set.difference(&other).map(Name::as_str).eq(["a"]));
        assert!(set.contains("z") && !set.contains("m"));
    }
}
