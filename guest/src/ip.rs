//! Canonical IP text: every address and location is parsed and printed back, so that two
//! spellings of one IPv6 address never become two keys.

use crate::name::Name;
use std::net::IpAddr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

/// The canonical text of an IP address and its family; `None` when it is not an IP address.
///
/// An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is the IPv4 address it maps (`10.0.0.1`), as
/// Go's `net.ParseIP` and Kubernetes' legacy validation read it; it is not an IPv6 location. A
/// zone id (`fe80::1%eth0`) is not an address.
pub fn canonical(text: &str) -> Option<(Name, Family)> {
    let text = text.trim();
    match text.parse().ok()? {
        // The IPv4 parser accepts only the canonical dotted quad (no leading zeros), so the text
        // is already canonical: no formatting, which is most of the cost on the hot path.
        IpAddr::V4(_) => Some((Name::new(text), Family::V4)),
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(v4) => Some((Name::from(v4.to_string()), Family::V4)),
            None => Some((Name::from(ip.to_string()), Family::V6)),
        },
    }
}

/// The location for an address of `family` on a node: the node's InternalIP of the same family,
/// the smallest canonical text when it has several (upstream `SelectSameFamilyNodeIP`).
pub fn same_family_location<'a>(internal_ips: impl IntoIterator<Item = &'a String>, family: Family) -> Option<Name> {
    internal_ips.into_iter().filter_map(|ip| canonical(ip)).filter(|(_, f)| *f == family).map(|(ip, _)| ip).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Regression: IPv4-mapped IPv6 addresses became IPv6 locations.
    #[test]
    fn an_ipv4_mapped_ipv6_address_is_the_ipv4_address_it_maps_and_a_zone_id_is_no_address() {
        assert_eq!(canonical("::ffff:10.244.0.1").unwrap(), (Name::new("10.244.0.1"), Family::V4));
        assert_eq!(canonical("::FFFF:0a00:0001").unwrap(), (Name::new("10.0.0.1"), Family::V4));
        assert_eq!(canonical("::10.0.0.1").unwrap().1, Family::V6, "IPv4-compatible is IPv6");
        assert!(canonical("fe80::1%eth0").is_none());
    }

    // Upstream TestConvertLocationDTOsToAddressLocations and
    // TestSelectSameFamilyNodeIP_DeterministicAndValidated.
    #[test]
    fn ipv6_spellings_collapse_to_one_canonical_text() {
        assert_eq!(canonical("FD00:0:0::0A").unwrap().0, "fd00::a");
        assert_eq!(canonical(" 10.0.0.1 ").unwrap(), (Name::new("10.0.0.1"), Family::V4));
        assert!(canonical("10.0.0.256").is_none());
        assert!(canonical("010.0.0.1").is_none(), "leading zeros are not an IPv4 address");
    }

    // Upstream TestSelectSameFamilyNodeIP_DeterministicAndValidated.
    #[test]
    fn a_node_with_several_internal_ips_uses_the_smallest_of_the_family() {
        let ips = vec!["10.0.0.9".to_string(), "fd00::2".into(), "10.0.0.10".into(), "FD00::1".into()];
        assert_eq!(same_family_location(&ips, Family::V4).as_deref(), Some("10.0.0.10"));
        assert_eq!(same_family_location(&ips, Family::V6).as_deref(), Some("fd00::1"));
        assert_eq!(same_family_location(&ips[..1], Family::V6), None);
    }
}
