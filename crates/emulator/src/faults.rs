//! Switchable faults: what the emulator answers instead of the real thing, for which
//! operation, how many times, optionally only for one resource name.
//!
//! As JSON (`POST /emulator/faults`, one fault or a list):
//! `{"operation": "update-services", "count": 2, "resource": "uid-1", "mode": {"kind": "status", "status": 429, "retryAfterSecs": 7}}`.

use clb_azure::Operation;
use clb_azure::wire::ErrorBody;
use serde::{Deserialize, Serialize};

/// A fault to inject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    pub operation: Operation,
    /// Only calls that name this resource (a service, location, public IP, load balancer, or
    /// pool as `lb/pool`); calls that name none (lists) never match a fault that has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// How many matching calls it answers; absent: all of them until cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    pub mode: FaultMode,
}

impl Fault {
    /// Answers every matching call until cleared.
    pub fn always(operation: Operation, mode: FaultMode) -> Self {
        Self { operation, resource: None, count: None, mode }
    }

    /// Answers the next `count` matching calls.
    pub fn times(operation: Operation, count: u32, mode: FaultMode) -> Self {
        Self { operation, resource: None, count: Some(count), mode }
    }

    pub fn on(mut self, resource: impl Into<String>) -> Self {
        self.resource = Some(resource.into());
        self
    }

    pub(crate) fn matches(&self, op: Operation, resources: &[String]) -> bool {
        self.operation == op && self.resource.as_ref().is_none_or(|r| resources.iter().any(|x| x == r))
    }
}

/// How a fault answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum FaultMode {
    /// 202 and an operation to poll, which ends after `polls` in-progress answers. When it is to
    /// succeed the request is applied at once (a request NRP refuses is still refused
    /// synchronously); when it is to fail nothing is applied.
    Async {
        #[serde(default)]
        outcome: AsyncOutcome,
        #[serde(default)]
        polls: u32,
        /// Poll through `Location` (202 until done) instead of `Azure-AsyncOperation`.
        #[serde(default)]
        via_location: bool,
        /// `Retry-After` on the 202 and on every in-progress poll; absent: 0.
        #[serde(default)]
        retry_after_secs: Option<u64>,
        /// The error a failed operation reports.
        #[serde(default)]
        error: Option<ErrorBody>,
    },
    /// 200 whose body is `{"error": {code, message}}`; nothing is applied.
    ErrorBody { code: String, message: String },
    /// This status with the ARM error envelope (a default code per status when `code` is empty)
    /// and, if given, `Retry-After`; nothing is applied.
    Status {
        status: u16,
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
        #[serde(default)]
        retry_after_secs: Option<u64>,
    },
    /// Over HTTP: no answer until the client times out, or until the faults are cleared, when
    /// the connection is closed without one (so a test need not wait out the client's timeout).
    /// In-process: the timeout error.
    Hang,
    /// Over HTTP: the connection is closed without an answer. In-process: the transport error.
    Drop,
}

impl FaultMode {
    /// `status` with its default code and no `Retry-After`.
    pub fn status(status: u16) -> Self {
        FaultMode::Status { status, code: String::new(), message: String::new(), retry_after_secs: None }
    }

    pub fn throttled(retry_after_secs: u64) -> Self {
        FaultMode::Status {
            status: 429,
            code: String::new(),
            message: String::new(),
            retry_after_secs: Some(retry_after_secs),
        }
    }

    pub fn async_ending(outcome: AsyncOutcome, polls: u32) -> Self {
        FaultMode::Async { outcome, polls, via_location: false, retry_after_secs: None, error: None }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum AsyncOutcome {
    #[default]
    Succeeded,
    Failed,
    Canceled,
}

/// A fault with what is left of its count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveFault {
    pub fault: Fault,
    /// Calls it still answers; absent: until cleared.
    pub remaining: Option<u32>,
}
