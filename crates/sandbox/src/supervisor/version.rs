//! A logic version as the supervisor holds it: borrowed or owned, and its name in logs.

use crate::LoadedLogic;
use std::ops::Deref;

/// A logic version the supervisor runs: borrowed (the built-in logic, loaded once) or owned (one
/// loaded for a swap).
pub enum LogicRef<'a> {
    Borrowed(&'a LoadedLogic),
    Owned(Box<LoadedLogic>),
}

impl Deref for LogicRef<'_> {
    type Target = LoadedLogic;
    fn deref(&self) -> &LoadedLogic {
        match self {
            LogicRef::Borrowed(logic) => logic,
            LogicRef::Owned(logic) => logic,
        }
    }
}

impl<'a> From<&'a LoadedLogic> for LogicRef<'a> {
    fn from(logic: &'a LoadedLogic) -> Self {
        LogicRef::Borrowed(logic)
    }
}

impl From<LoadedLogic> for LogicRef<'_> {
    fn from(logic: LoadedLogic) -> Self {
        LogicRef::Owned(Box::new(logic))
    }
}

/// A logic version's name in logs and reports: the start of its sha256.
pub fn version_name(logic: &LoadedLogic) -> String {
    logic.info().sha256.chars().take(12).collect()
}
