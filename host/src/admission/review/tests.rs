use super::*;
use clb_sandbox::bindings::exports::clb::reconciler::validation::Rejection;
use serde_json::{Value, json};

fn service(policy: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "shop", "name": "legacy", "uid": "0b1c2d3e-0000-4000-8000-000000000001"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": policy,
                 "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}
    })
}

fn review(operation: &str, kind: (&str, &str, &str), object: Value) -> Vec<u8> {
    let (group, version, kind) = kind;
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": "services"},
            "name": "legacy", "namespace": "shop", "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object, "oldObject": null, "dryRun": false
        }
    }))
    .unwrap()
}

const SERVICE: (&str, &str, &str) = ("", "v1", "Service");

#[test]
fn only_a_create_or_update_of_a_core_v1_service_is_put_to_the_logic() {
    let cases = [
        ("CREATE", SERVICE, service("Cluster"), true),
        ("UPDATE", SERVICE, service("Local"), true),
        ("DELETE", SERVICE, Value::Null, false),
        ("CONNECT", SERVICE, Value::Null, false),
        ("CREATE", ("", "v1", "Pod"), json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}), false),
        ("CREATE", ("example.com", "v1", "Service"), json!({"apiVersion": "example.com/v1", "kind": "Service"}), false),
    ];
    for (operation, kind, object, judged) in cases {
        let review = Review::read(&review(operation, kind, object)).unwrap();
        assert_eq!(review.service().is_some(), judged, "{operation} {kind:?}");
        assert_eq!(review.operation(), operation);
    }
}

#[test]
fn the_service_judged_is_the_object_of_the_request_with_the_requests_namespace_when_it_has_none() {
    let mut object = service("Local");
    object["metadata"] = json!({"generateName": "web-"});
    let review = Review::read(&review("CREATE", SERVICE, object)).unwrap();
    let judged = review.service().unwrap();
    assert_eq!((judged.namespace.as_str(), judged.name.as_str()), ("shop", "legacy"));
    assert_eq!(judged.external_traffic_policy.as_deref(), Some("Local"));
}

#[test]
fn a_body_that_is_no_admission_review_it_can_answer_is_refused_with_its_reason() {
    let v1beta1 = serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
        "request": {"uid": "x"}}))
    .unwrap();
    let cases: [(&[u8], &str); 5] = [
        (b"not json", "not an AdmissionReview"),
        (br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#, "no request"),
        (&v1beta1, "this endpoint answers admission.k8s.io/v1"),
        (&review("CREATE", SERVICE, Value::Null), "carries no object"),
        (&review("CREATE", SERVICE, json!({"spec": {"ports": "eighty"}})), "not a v1 Service"),
    ];
    for (body, expected) in cases {
        let error = Review::read(body).err().unwrap_or_else(|| panic!("{} was read", String::from_utf8_lossy(body)));
        assert!(error.to_string().contains(expected), "{error}");
    }
}

#[test]
fn only_a_rejection_denies_with_code_403_the_rules_reason_and_the_request_uid_echoed() {
    let review = Review::read(&review("CREATE", SERVICE, service("Cluster"))).unwrap();
    let rejected = Verdict::Rejected(Rejection {
        reason: "UnsupportedExternalTrafficPolicy".into(),
        message: "service shop/legacy: needs Local".into(),
    });
    let cases = [
        (rejected, Outcome::Denied),
        (Verdict::Admitted, Outcome::Allowed),
        (Verdict::NothingToProvision, Outcome::Allowed),
        (Verdict::Cleanup, Outcome::Allowed),
        (Verdict::Ignored("spec.type is ClusterIP, not LoadBalancer".into()), Outcome::Allowed),
    ];
    for (verdict, outcome) in cases {
        let (answer, got) = review.answer(&Admission { verdict: verdict.clone(), warnings: Vec::new() });
        assert_eq!(got, outcome, "{verdict:?}");
        let answer = serde_json::to_value(&answer).unwrap();
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["kind"], "AdmissionReview");
        let response = &answer["response"];
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert!(response.get("warnings").is_none_or(Value::is_null), "no warnings to give: {answer}");
        assert_eq!(response["allowed"], outcome == Outcome::Allowed, "{answer}");
        if outcome == Outcome::Denied {
            assert_eq!(response["status"]["code"], 403);
            assert_eq!(response["status"]["reason"], "UnsupportedExternalTrafficPolicy");
            assert_eq!(
                response["status"]["message"],
                "UnsupportedExternalTrafficPolicy: service shop/legacy: needs Local"
            );
        }
    }
}

#[test]
fn the_logics_warnings_go_to_response_warnings_allowed_or_denied_bounded_in_number_and_length() {
    let review = Review::read(&review("CREATE", SERVICE, service("Local"))).unwrap();
    let rejected = Verdict::Rejected(Rejection { reason: "InvalidPort".into(), message: "port 0".into() });
    for verdict in [Verdict::Admitted, rejected] {
        let warnings = vec!["annotation a is ignored".to_owned(), "annotation b is ignored".to_owned()];
        let (answer, _) = review.answer(&Admission { verdict: verdict.clone(), warnings: warnings.clone() });
        let answer = serde_json::to_value(&answer).unwrap();
        assert_eq!(answer["response"]["warnings"], json!(warnings), "{verdict:?}");
    }
    // A component other than the built-in one may return anything: the answer stays small.
    let flood =
        Admission { verdict: Verdict::Admitted, warnings: vec![format!("{}\nnext line", "é".repeat(1000)); 50] };
    let (answer, _) = review.answer(&flood);
    let warnings = serde_json::to_value(&answer).unwrap()["response"]["warnings"].clone();
    let warnings = warnings.as_array().unwrap();
    assert_eq!(warnings.len(), MAX_WARNINGS);
    for warning in warnings {
        let warning = warning.as_str().unwrap();
        assert_eq!(warning.chars().count(), MAX_WARNING_CHARS, "cut, with an ellipsis: {warning}");
        assert!(warning.ends_with('…') && !warning.contains('\n'), "{warning}");
    }
    let short = "a warning\twith a tab";
    let (answer, _) = review.answer(&Admission { verdict: Verdict::Admitted, warnings: vec![short.into()] });
    assert_eq!(serde_json::to_value(&answer).unwrap()["response"]["warnings"], json!(["a warning with a tab"]));
}

#[test]
fn a_request_the_logic_could_not_judge_is_allowed_with_a_warning_or_denied_as_the_policy_says() {
    let review = Review::read(&review("CREATE", SERVICE, service("Cluster"))).unwrap();
    let (open, outcome) = review.failed(FailurePolicy::Open, "the guest trapped");
    let open = serde_json::to_value(&open).unwrap();
    assert_eq!((open["response"]["allowed"].as_bool(), outcome), (Some(true), Outcome::Failed));
    assert!(open["response"]["warnings"][0].as_str().unwrap().contains("the guest trapped"), "{open}");
    let (closed, _) = review.failed(FailurePolicy::Closed, "the deadline passed");
    let closed = serde_json::to_value(&closed).unwrap();
    assert_eq!(closed["response"]["allowed"], false);
    assert_eq!(closed["response"]["status"]["code"], 500);
    assert!(closed["response"]["status"]["message"].as_str().unwrap().contains("the deadline passed"));
}
