//! A logic version as the supervisor holds it: borrowed or owned, and its name in logs.

use crate::Logic;
use std::ops::Deref;

/// A logic version the supervisor runs: borrowed (the built-in logic, loaded once) or owned (one
/// loaded for a swap).
pub enum LogicRef<'a> {
    Borrowed(&'a Logic),
    Owned(Box<Logic>),
}

impl Deref for LogicRef<'_> {
    type Target = Logic;
    fn deref(&self) -> &Logic {
        match self {
            LogicRef::Borrowed(logic) => logic,
            LogicRef::Owned(logic) => logic,
        }
    }
}

impl<'a> From<&'a Logic> for LogicRef<'a> {
    fn from(logic: &'a Logic) -> Self {
        LogicRef::Borrowed(logic)
    }
}

impl From<Logic> for LogicRef<'_> {
    fn from(logic: Logic) -> Self {
        LogicRef::Owned(Box::new(logic))
    }
}

/// A logic version's name in logs and reports: the start of its sha256.
pub fn version_name(logic: &Logic) -> String {
    logic.info().sha256.chars().take(12).collect()
}
