use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

#[derive(Clone, Debug)]
enum Op {
    Insert(u8, u16),
    Remove(u8),
    Entry(u8, u16),
    Retain(u8),
    PopFirst,
    PopLast,
    Mutate(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Op::Insert(k % 40, v)),
        any::<u8>().prop_map(|k| Op::Remove(k % 40)),
        (any::<u8>(), any::<u16>()).prop_map(|(k, v)| Op::Entry(k % 40, v)),
        any::<u8>().prop_map(|m| Op::Retain(m % 5 + 2)),
        Just(Op::PopFirst),
        Just(Op::PopLast),
        any::<u16>().prop_map(Op::Mutate),
    ]
}

proptest! {
    /// Every operation answers as `BTreeMap`'s and `BTreeSet`'s do, the contents after each
    /// are theirs in their order, the postcard bytes are theirs, and what is read back from
    /// them is equal; the slab never holds more slots than the most entries held at once.
    #[test]
    fn a_map_and_a_set_answer_order_and_serialize_as_the_std_collections_do(ops in proptest::collection::vec(op(), 0..200)) {
        let mut ours: Map<String, u16> = Map::new();
        let mut std: BTreeMap<String, u16> = BTreeMap::new();
        let mut our_set: Set<String> = Set::new();
        let mut std_set: BTreeSet<String> = BTreeSet::new();
        let mut most = 0;
        for op in ops {
            match op {
                Op::Insert(k, v) => {
                    let k = format!("k{k}");
                    prop_assert_eq!(ours.insert(k.clone(), v), std.insert(k.clone(), v));
                    prop_assert_eq!(our_set.insert(k.clone()), std_set.insert(k));
                }
                Op::Remove(k) => {
                    let k = format!("k{k}");
                    prop_assert_eq!(ours.remove(&k), std.remove(&k));
                    prop_assert_eq!(our_set.remove(&k), std_set.remove(&k));
                }
                Op::Entry(k, v) => {
                    let k = format!("k{k}");
                    // Wrapping: an entry inserted at u16::MAX is bumped too (the test's own
                    // overflow once failed it, not the map).
                    let (ours, std) = (ours.entry(k.clone()).or_insert(v), std.entry(k).or_insert(v));
                    (*ours, *std) = (ours.wrapping_add(1), std.wrapping_add(1));
                }
                Op::Retain(m) => {
                    ours.retain(|_, v| *v % u16::from(m) != 0);
                    std.retain(|_, v| *v % u16::from(m) != 0);
                    our_set.retain(|k| k.len() % usize::from(m) != 0);
                    std_set.retain(|k| k.len() % usize::from(m) != 0);
                }
                Op::PopFirst => {
                    prop_assert_eq!(ours.pop_first(), std.pop_first());
                    prop_assert_eq!(our_set.pop_first(), std_set.pop_first());
                }
                Op::PopLast => {
                    prop_assert_eq!(ours.pop_last(), std.pop_last());
                    prop_assert_eq!(our_set.pop_last(), std_set.pop_last());
                }
                Op::Mutate(by) => {
                    ours.values_mut().for_each(|v| *v = v.wrapping_add(by));
                    std.values_mut().for_each(|v| *v = v.wrapping_add(by));
                }
            }
            most = most.max(std.len());
            prop_assert!(ours.slots.len() <= most);
            prop_assert!(ours.iter().eq(std.iter()));
            prop_assert!(our_set.iter().eq(std_set.iter()));
            prop_assert_eq!(ours.first_key_value(), std.first_key_value());
            prop_assert_eq!(ours.len(), std.len());
        }
        let bytes = postcard::to_allocvec(&ours).unwrap();
        prop_assert_eq!(&bytes, &postcard::to_allocvec(&std).unwrap());
        let back: Map<String, u16> = postcard::from_bytes(&bytes).unwrap();
        prop_assert_eq!(&back, &ours);
        let set_bytes = postcard::to_allocvec(&our_set).unwrap();
        prop_assert_eq!(&set_bytes, &postcard::to_allocvec(&std_set).unwrap());
        let back: Set<String> = postcard::from_bytes(&set_bytes).unwrap();
        prop_assert_eq!(&back, &our_set);
        prop_assert!(ours.clone().into_iter().eq(std.into_iter()));
    }
}

proptest! {
    /// The one sort orders as `slice::sort_by` does, equal items kept in the order they came.
    #[test]
    fn the_shared_sort_orders_stably_as_the_std_sort_does(items in proptest::collection::vec((0u8..8, any::<u16>()), 0..300)) {
        let mut ours = items.clone();
        let mut std = items;
        sort_by(&mut ours, |a, b| a.0.cmp(&b.0));
        std.sort_by_key(|item| item.0);
        prop_assert_eq!(ours, std);
    }
}

#[test]
fn a_repeated_key_read_from_a_state_keeps_its_last_value_as_a_btree_map_reader_does() {
    let pairs: Vec<(u8, u8)> = vec![(2, 1), (1, 7), (2, 9)];
    // postcard writes a map as its length and its entries, as a sequence of pairs.
    let bytes = postcard::to_allocvec(&pairs).unwrap();
    let ours: Map<u8, u8> = postcard::from_bytes(&bytes).unwrap();
    let std: BTreeMap<u8, u8> = postcard::from_bytes(&bytes).unwrap();
    assert!(ours.iter().eq(std.iter()));
    assert_eq!(ours.get(&2), Some(&9));
}

#[test]
fn maps_that_differ_only_in_where_their_values_sit_are_equal() {
    let mut a: Map<&str, u8> = Map::from([("y", 2)]);
    a.insert("x", 1);
    let b: Map<&str, u8> = Map::from([("x", 1), ("y", 2)]);
    assert_ne!(a.slots, b.slots);
    assert_eq!(a, b);
}
