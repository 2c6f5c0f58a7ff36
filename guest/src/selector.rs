//! Kubernetes label selectors (`metav1.LabelSelector`), as placement reads upstream's
//! `serviceLabelSelector` and `serviceNamespaceSelector`: checked as the API machinery's
//! `LabelSelectorAsSelector` checks them, and matched against a set of labels.
//!
//! `matchLabels` entries are `In` requirements of one value; a selector with neither labels nor
//! expressions matches everything. Keys are qualified names (an optional DNS-subdomain prefix and
//! `/`, then a name of at most 63 characters); values are label values (at most 63 characters,
//! possibly empty).

use serde::{Deserialize, Serialize};

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`, spelled as Kubernetes spells them.
    pub operator: String,
    pub values: Vec<String>,
}

/// A label selector as the operator wrote it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSelector {
    pub match_labels: Vec<(String, String)>,
    pub match_expressions: Vec<Requirement>,
}

impl LabelSelector {
    /// Why the selector is not one Kubernetes accepts, or `Ok`.
    pub fn check(&self) -> Result<(), String> {
        for (key, value) in &self.match_labels {
            check_key(key)?;
            check_value(key, value)?;
        }
        for requirement in &self.match_expressions {
            let key = &requirement.key;
            check_key(key)?;
            match requirement.operator.as_str() {
                "In" | "NotIn" if requirement.values.is_empty() => {
                    return Err(
                        "values: Invalid value: null: for 'in', 'notin' operators, values set can't be empty".into()
                    );
                }
                "In" | "NotIn" => {}
                "Exists" | "DoesNotExist" if !requirement.values.is_empty() => {
                    return Err(format!(
                        "values: Invalid value: {:?}: values set must be empty for exists and does not exist",
                        requirement.values
                    ));
                }
                "Exists" | "DoesNotExist" => {}
                other => {
                    return Err(format!(
                        "operator: Unsupported value: {other:?}: supported values: \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\""
                    ));
                }
            }
            for value in &requirement.values {
                check_value(key, value)?;
            }
        }
        Ok(())
    }

    /// Whether `labels` satisfy every requirement. A selector that fails [`check`](Self::check)
    /// matches nothing.
    pub fn matches(&self, labels: &[(String, String)]) -> bool {
        self.select(labels).unwrap_or(false)
    }

    /// [`check`](Self::check), then [`matches`](Self::matches): one pass over the selector for
    /// a caller that reports why a selector is refused.
    pub fn select(&self, labels: &[(String, String)]) -> Result<bool, String> {
        self.check()?;
        Ok(self.satisfied_by(labels))
    }

    /// [`matches`](Self::matches) for a selector already [checked](Self::check).
    pub(crate) fn satisfied_by(&self, labels: &[(String, String)]) -> bool {
        let get = |key: &str| labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let by_labels = self.match_labels.iter().all(|(key, value)| get(key) == Some(value.as_str()));
        by_labels
            && self.match_expressions.iter().all(|r| {
                let value = get(&r.key);
                let listed = value.is_some_and(|v| r.values.iter().any(|w| w == v));
                match r.operator.as_str() {
                    "In" => listed,
                    "NotIn" => !listed,
                    "Exists" => value.is_some(),
                    _ => value.is_none(),
                }
            })
    }
}

/// A name part: at most 63 characters, alphanumerics at both ends, `-`, `_` and `.` between.
fn is_name_part(text: &str) -> bool {
    let bytes = text.as_bytes();
    let inner_ok = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes.iter().all(inner_ok)
}

/// A DNS subdomain: at most 253 characters, dot-separated lower-case labels.
fn is_dns_subdomain(text: &str) -> bool {
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    };
    !text.is_empty() && text.len() <= 253 && text.split('.').all(label_ok)
}

fn check_key(key: &str) -> Result<(), String> {
    let ok = match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_name_part(name),
        None => is_name_part(key),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{key:?} is not a valid label key: a name of at most 63 alphanumerics, '-', '_' or '.' \
             (alphanumeric at both ends), optionally after a DNS subdomain prefix and '/'"
        ))
    }
}

fn check_value(key: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || is_name_part(value) {
        Ok(())
    } else {
        Err(format!(
            "{value:?} (key {key:?}) is not a valid label value: empty, or at most 63 alphanumerics, \
             '-', '_' or '.' (alphanumeric at both ends)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> Requirement {
        Requirement { key: key.into(), operator: operator.into(), values: values.iter().map(|v| (*v).into()).collect() }
    }

    #[test]
    fn an_empty_selector_matches_every_set_of_labels() {
        let selector = LabelSelector::default();
        assert!(selector.matches(&[]));
        assert!(selector.matches(&labels(&[("app", "web")])));
    }

    #[test]
    fn match_labels_need_every_pair_exactly() {
        let selector =
            LabelSelector { match_labels: labels(&[("app", "web"), ("tier", "front")]), ..Default::default() };
        assert!(selector.matches(&labels(&[("tier", "front"), ("app", "web"), ("x", "y")])));
        assert!(!selector.matches(&labels(&[("app", "web")])));
        assert!(!selector.matches(&labels(&[("app", "Web"), ("tier", "front")])));
    }

    #[test]
    fn each_operator_reads_as_kubernetes_reads_it() {
        let cases = [
            (expression("team", "In", &["a", "b"]), &[("team", "b")][..], true),
            (expression("team", "In", &["a"]), &[][..], false),
            (expression("team", "NotIn", &["a"]), &[][..], true),
            (expression("team", "NotIn", &["a"]), &[("team", "a")][..], false),
            (expression("team", "Exists", &[]), &[("team", "")][..], true),
            (expression("team", "Exists", &[]), &[][..], false),
            (expression("team", "DoesNotExist", &[]), &[][..], true),
            (expression("team", "DoesNotExist", &[]), &[("team", "a")][..], false),
        ];
        for (requirement, have, want) in cases {
            let selector = LabelSelector { match_expressions: vec![requirement.clone()], ..Default::default() };
            assert_eq!(selector.matches(&labels(have)), want, "{requirement:?} on {have:?}");
        }
    }

    #[test]
    fn selectors_kubernetes_refuses_are_refused_and_match_nothing() {
        let bad = [
            LabelSelector { match_expressions: vec![expression("team", "in", &["a"])], ..Default::default() },
            LabelSelector { match_expressions: vec![expression("team", "In", &[])], ..Default::default() },
            LabelSelector { match_expressions: vec![expression("team", "Exists", &["a"])], ..Default::default() },
            LabelSelector { match_labels: labels(&[("-team", "a")]), ..Default::default() },
            LabelSelector { match_labels: labels(&[("Example.com/team", "a")]), ..Default::default() },
            LabelSelector { match_labels: labels(&[("team", "a b")]), ..Default::default() },
            LabelSelector { match_labels: labels(&[(&"k".repeat(64), "a")]), ..Default::default() },
        ];
        for selector in bad {
            assert!(selector.check().is_err(), "{selector:?}");
            assert!(!selector.matches(&labels(&[("team", "a")])), "{selector:?}");
        }
        let good = LabelSelector {
            match_labels: labels(&[("example.com/team", ""), ("app.kubernetes.io/name", "web_1.x")]),
            match_expressions: vec![expression("tier", "NotIn", &["back"])],
        };
        assert_eq!(good.check(), Ok(()));
    }
}
