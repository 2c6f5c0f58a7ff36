//! One `admission.k8s.io/v1` AdmissionReview: what it asks the logic, and the answer it gets
//! back. Sans-IO: bytes in, the Service to judge (if any) out, and the review to send back built
//! from the logic's verdict or from the failure policy.
//!
//! Only a `CREATE` or an `UPDATE` of a core `v1` Service is judged, on the object it would
//! store (an `UPDATE` on the new object); anything else is allowed without asking the logic (a
//! `DELETE`, another kind, a sub-resource such as `status`). The logic's verdict decides the
//! rest: only a rejection denies (code 403, the rule's reason, its message naming the Service);
//! a Service the logic ignores (another `loadBalancerClass`, not a LoadBalancer, a configuration
//! not in CLB mode) or cleans up (being deleted: an update that only finishes a deletion) is
//! allowed whatever its spec.

use clb_executor::records;
use clb_sandbox::bindings::clb::reconciler::types as wit;
use clb_sandbox::bindings::exports::clb::reconciler::validation::{Admission, Verdict};
use k8s_openapi::api::core::v1::Service;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::Status;
use kube::core::{DynamicObject, TypeMeta};

/// Why a body is not an AdmissionReview this endpoint can answer (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview: {0}")]
    NotAReview(#[source] serde_json::Error),
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("the AdmissionReview is {0:?}; this endpoint answers admission.k8s.io/v1")]
    WrongVersion(String),
    #[error("the request's object is not a v1 Service: {0}")]
    NotAService(#[source] serde_json::Error),
    #[error("a {0:?} request for a Service carries no object")]
    NoObject(Operation),
}

/// What was asked, read from one AdmissionReview.
pub struct Review {
    request: AdmissionRequest<DynamicObject>,
    /// The Service to judge, as the logic reads it; `None`: allowed without asking.
    service: Option<wit::Service>,
}

/// How an answer came about, for the metrics and the logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not a Service create or update: allowed without asking the logic.
    Skipped,
    Allowed,
    Denied,
    /// The logic did not answer (a trap, its limits, the deadline): the failure policy answered.
    Failed,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Skipped => "skipped",
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Failed => "failed",
        }
    }
}

/// Whether a request the logic could not judge is allowed (`open`) or denied (`closed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    Open,
    Closed,
}

impl Review {
    /// Reads an AdmissionReview. A review of another kind, or of an operation that is not
    /// judged, reads fine (and is allowed); one whose Service object does not parse is refused.
    pub fn read(body: &[u8]) -> Result<Review, ReviewError> {
        let wrong_version = |types: &TypeMeta| {
            let v1 = types.api_version == "admission.k8s.io/v1" && types.kind == "AdmissionReview";
            (!v1).then(|| ReviewError::WrongVersion(format!("{}/{}", types.api_version, types.kind)))
        };
        let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
            Ok(review) => review,
            // A review of another version fails on its fields; its version says more. Read
            // again only on this path, never for a review that parses.
            Err(e) => {
                let types = serde_json::from_slice::<TypeMeta>(body).ok();
                return Err(types.as_ref().and_then(wrong_version).unwrap_or(ReviewError::NotAReview(e)));
            }
        };
        if let Some(wrong) = wrong_version(&review.types) {
            return Err(wrong);
        }
        let request: AdmissionRequest<DynamicObject> = review.try_into().map_err(|_| ReviewError::NoRequest)?;
        let judged = matches!(request.operation, Operation::Create | Operation::Update)
            && request.kind.group.is_empty()
            && request.kind.version == "v1"
            && request.kind.kind == "Service"
            && request.sub_resource.as_deref().unwrap_or("").is_empty();
        let service = if judged {
            let object = request.object.as_ref().ok_or_else(|| ReviewError::NoObject(request.operation.clone()))?;
            let value = serde_json::to_value(object).map_err(ReviewError::NotAService)?;
            let mut service: Service = serde_json::from_value(value).map_err(ReviewError::NotAService)?;
            // A create may come before the API server names the object (`generateName`) or
            // gives it a namespace from the request's path: the request says where it goes.
            if service.metadata.namespace.as_deref().unwrap_or("").is_empty() {
                service.metadata.namespace = request.namespace.clone();
            }
            if service.metadata.name.as_deref().unwrap_or("").is_empty() && !request.name.is_empty() {
                service.metadata.name = Some(request.name.clone());
            }
            Some(records::service(&service))
        } else {
            None
        };
        Ok(Review { request, service })
    }

    /// The Service the logic is to judge; `None`: the answer is [`Self::skip`].
    pub fn service(&self) -> Option<&wit::Service> {
        self.service.as_ref()
    }

    /// `namespace/name` of what the request is about, for the logs.
    pub fn subject(&self) -> String {
        format!("{}/{}", self.request.namespace.as_deref().unwrap_or(""), self.request.name)
    }

    /// The request's operation, as the API server spells it (`CREATE`, `UPDATE`, …).
    pub fn operation(&self) -> &'static str {
        match self.request.operation {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }

    /// Allowed without asking the logic.
    pub fn skip(&self) -> (AdmissionReview<DynamicObject>, Outcome) {
        (AdmissionResponse::from(&self.request).into_review(), Outcome::Skipped)
    }

    /// The answer the logic's verdict gives: denied only when it rejects the Service; its
    /// warnings, allowed or denied, go to `response.warnings` (which `kubectl` prints), at
    /// most [`MAX_WARNINGS`] of at most [`MAX_WARNING_CHARS`] characters each whatever a
    /// component returns.
    pub fn answer(&self, judged: &Admission) -> (AdmissionReview<DynamicObject>, Outcome) {
        let mut response = AdmissionResponse::from(&self.request);
        if !judged.warnings.is_empty() {
            response.warnings = Some(judged.warnings.iter().take(MAX_WARNINGS).map(|w| bounded(w)).collect());
        }
        match &judged.verdict {
            Verdict::Rejected(rejection) => {
                let message = format!("{}: {}", rejection.reason, rejection.message);
                let mut response = response.deny(&message);
                response.result = Status::failure(&message, &rejection.reason).with_code(403);
                (response.into_review(), Outcome::Denied)
            }
            Verdict::Admitted | Verdict::NothingToProvision | Verdict::Cleanup | Verdict::Ignored(_) => {
                (response.into_review(), Outcome::Allowed)
            }
        }
    }

    /// The answer when the logic did not judge (`why`: a trap, its limits, the deadline), as
    /// `policy` says: allowed with a warning naming the cause, or denied (code 500) saying so.
    pub fn failed(&self, policy: FailurePolicy, why: &str) -> (AdmissionReview<DynamicObject>, Outcome) {
        let message = format!("the Container Load Balancer's admission logic could not judge this Service: {why}");
        let mut response = AdmissionResponse::from(&self.request);
        match policy {
            FailurePolicy::Open => response.warnings = Some(vec![format!("{message}; allowed (failure policy open)")]),
            FailurePolicy::Closed => {
                response = response.deny(&message);
                response.result = Status::failure(&message, "InternalError").with_code(500);
            }
        }
        (response.into_review(), Outcome::Failed)
    }
}

/// The most warnings an answer carries: the built-in logic gives at most ten; another
/// component is held to the same.
pub const MAX_WARNINGS: usize = 10;

/// The longest warning an answer carries, in characters: the API server shortens longer ones in
/// the `Warning` header it sends on, so a longer one is cut here, where the cut is visible.
pub const MAX_WARNING_CHARS: usize = 256;

/// One warning on one line, at most [`MAX_WARNING_CHARS`] characters (a cut one ends in `…`).
fn bounded(warning: &str) -> String {
    let line: String = warning.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    match line.char_indices().nth(MAX_WARNING_CHARS - 1) {
        Some((cut, _)) if line.chars().count() > MAX_WARNING_CHARS => format!("{}…", &line[..cut]),
        _ => line,
    }
}

#[cfg(test)]
mod tests;
