//! The Azure side: the ARM client against the emulator over loopback, fault by fault; the
//! emulator's docs/upstream.md §h.3 semantics through the in-process core; the credential sources.

use clb_arm::auth::{TokenFile, WorkloadIdentity};
use clb_arm::{ArmClient, ArmConfig, Credential};
use clb_azure::*;
use clb_emulator::{AsyncOutcome, Emulator, EmulatorConfig, EmulatorServer, Fault, FaultMode, Resources};
use clb_tests::test_scope;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn emulator() -> Arc<Emulator> {
    // Pages of two, so that every list over HTTP follows nextLink.
    Arc::new(Emulator::with_config(test_scope(), EmulatorConfig { page_size: 2, ..Default::default() }))
}

fn client(url: &str, request_timeout: Duration, credential: Credential) -> ArmClient {
    let mut config = ArmConfig::new(url, test_scope());
    config.request_timeout = request_timeout;
    config.nrp_request_timeout = request_timeout;
    config.poll_interval = Duration::from_millis(10);
    ArmClient::new(config, credential).expect("the client builds")
}

async fn serve(emulator: Arc<Emulator>) -> EmulatorServer {
    EmulatorServer::start(emulator, "127.0.0.1:0".parse().unwrap()).await.expect("the emulator listens")
}

fn inbound(name: &str) -> ServiceRequest {
    ServiceRequest {
        name: name.into(),
        service_type: ServiceType::Inbound,
        backend_pools: vec![PoolRef { load_balancer: name.into(), pool: name.into() }],
        nat_gateway: NatGatewayLink::Omit,
        is_delete: false,
    }
}

/// An Outbound registration of the egress identity `name`, linked to its NAT gateway as `link` says.
fn outbound(name: &str, link: NatGatewayLink) -> ServiceRequest {
    ServiceRequest {
        name: name.into(),
        service_type: ServiceType::Outbound,
        backend_pools: vec![],
        nat_gateway: link,
        is_delete: false,
    }
}

fn unregister(name: &str) -> ServiceRequest {
    ServiceRequest { backend_pools: vec![], is_delete: true, ..inbound(name) }
}

fn location(node: &str, action: UpdateAction, addresses: &[(&str, &[&str])]) -> LocationUpdate {
    LocationUpdate {
        location: node.into(),
        action,
        addresses: addresses
            .iter()
            .map(|(address, services)| AddressServices {
                address: (*address).into(),
                services: services.iter().map(|s| (*s).into()).collect(),
            })
            .collect(),
    }
}

fn rule(protocol: Protocol, port: u16) -> LbRule {
    LbRule {
        name: format!("rule-{}-{port}", format!("{protocol:?}").to_lowercase()),
        protocol,
        frontend_port: port,
        backend_port: port,
        idle_timeout_minutes: 4,
        enable_tcp_reset: protocol == Protocol::Tcp,
    }
}

fn lb(name: &str, pip: &str, rules: Vec<LbRule>) -> LoadBalancerSpec {
    LoadBalancerSpec { name: name.into(), public_ip: pip.into(), backend_pool: name.into(), rules }
}

fn pip(name: &str) -> PublicIpSpec {
    PublicIpSpec { name: name.into(), version: IpVersion::IPv4 }
}

fn svc1_pool() -> PoolRef {
    PoolRef { load_balancer: "svc-1".into(), pool: "svc-1".into() }
}

/// A gateway with one inbound service wired up the CCM way, and spare resources to delete.
async fn seed(api: &impl AzureApi) {
    api.put_public_ip(&pip("svc-1-pip")).await.unwrap();
    api.put_public_ip(&pip("spare-pip")).await.unwrap();
    api.put_load_balancer(&lb("svc-1", "svc-1-pip", vec![rule(Protocol::Tcp, 80)])).await.unwrap();
    api.put_load_balancer(&lb("spare-lb", "svc-1-pip", vec![])).await.unwrap();
    api.update_services(UpdateAction::PartialUpdate, &[inbound("svc-1")]).await.unwrap();
    let update = location("10.0.0.4", UpdateAction::PartialUpdate, &[("10.244.0.5", &["svc-1"])]);
    api.update_address_locations(UpdateAction::PartialUpdate, &[update]).await.unwrap();
    api.put_public_ip(&pip("egress-1-pip")).await.unwrap();
    api.put_public_ip(&PublicIpSpec { name: "egress-1-pip-v6".into(), version: IpVersion::IPv6 }).await.unwrap();
    api.put_nat_gateway(&nat_gateway("egress-1", true)).await.unwrap();
    api.put_nat_gateway(&NatGatewaySpec {
        public_ips: vec![],
        public_ips_v6: vec![],
        ..nat_gateway("spare-natgw", false)
    })
    .await
    .unwrap();
}

/// The NAT gateway of an egress identity `name` the upstream way: on `<name>-pip` and `<name>-pip-v6`.
fn nat_gateway(name: &str, associated: bool) -> NatGatewaySpec {
    NatGatewaySpec {
        name: name.into(),
        public_ips: vec![format!("{name}-pip")],
        public_ips_v6: vec![format!("{name}-pip-v6")],
        associated,
    }
}

/// One call of `op` on the seeded gateway; its result as text, to compare across backends.
async fn call(api: &impl AzureApi, op: Operation) -> Result<String, AzureError> {
    Ok(match op {
        Operation::UpdateServices => {
            let outbound = outbound("egress-1", NatGatewayLink::Set("egress-1".into()));
            format!("{:?}", api.update_services(UpdateAction::PartialUpdate, &[outbound]).await?)
        }
        Operation::UpdateAddressLocations => {
            let update = location("10.0.0.5", UpdateAction::PartialUpdate, &[("10.244.1.7", &["svc-1"])]);
            format!("{:?}", api.update_address_locations(UpdateAction::PartialUpdate, &[update]).await?)
        }
        Operation::ListServices => format!("{:?}", api.list_services().await?),
        Operation::ListAddressLocations => format!("{:?}", api.list_address_locations().await?),
        Operation::ListPublicIps => format!("{:?}", api.list_public_ips().await?),
        Operation::ListLoadBalancers => format!("{:?}", api.list_load_balancers().await?),
        Operation::PutPublicIp => api.put_public_ip(&pip("svc-2-pip")).await?,
        Operation::DeletePublicIp => format!("{:?}", api.delete_public_ip("spare-pip").await?),
        Operation::PutLoadBalancer => {
            let spec = lb("svc-1", "svc-1-pip", vec![rule(Protocol::Tcp, 80), rule(Protocol::Udp, 53)]);
            format!("{:?}", api.put_load_balancer(&spec).await?)
        }
        Operation::DeleteLoadBalancer => format!("{:?}", api.delete_load_balancer("spare-lb").await?),
        Operation::GetBackendPool => format!("{:?}", api.get_backend_pool(&svc1_pool()).await?),
        Operation::ListNatGateways => format!("{:?}", api.list_nat_gateways().await?),
        // Disassociating, as a teardown does before the delete.
        Operation::PutNatGateway => format!("{:?}", api.put_nat_gateway(&nat_gateway("egress-1", false)).await?),
        Operation::DeleteNatGateway => format!("{:?}", api.delete_nat_gateway("spare-natgw").await?),
        Operation::DeleteBackendPool => format!("{:?}", api.delete_backend_pool(&svc1_pool()).await?),
        Operation::PutBackendPool => {
            // The read is not the faulted call; the write with its ETag is.
            let (mut pool, etag) = api.get_backend_pool(&svc1_pool()).await.expect("the pool reads");
            pool.addresses.push(BackendAddress { name: "node-1".into(), ip_address: "10.0.0.4".into() });
            format!("{:?}", api.put_backend_pool(&svc1_pool(), &pool, Some(&etag)).await?)
        }
    })
}

/// What a failed call must report: kind, status, ARM code, Retry-After.
type Expected = (ErrorKind, u16, &'static str, Option<u64>);

fn fault_table() -> Vec<(&'static str, FaultMode, Expected)> {
    use ErrorKind::*;
    let status = |status: u16, code: &str, retry: Option<u64>| FaultMode::Status {
        status,
        code: code.into(),
        message: String::new(),
        retry_after_secs: retry,
    };
    vec![
        // An injected status that names no code carries the emulator's own.
        ("401", FaultMode::status(401), (Http, 401, "InjectedFault", None)),
        ("404", FaultMode::status(404), (Http, 404, "ResourceNotFound", None)),
        ("409", FaultMode::status(409), (Http, 409, "Conflict", None)),
        ("412", FaultMode::status(412), (Http, 412, "PreconditionFailed", None)),
        ("429 with Retry-After", FaultMode::throttled(7), (Http, 429, "TooManyRequests", Some(7))),
        ("500", FaultMode::status(500), (Http, 500, "InternalServerError", None)),
        ("503 with its own code", status(503, "ServerBusy", Some(2)), (Http, 503, "ServerBusy", Some(2))),
        (
            "200 with an error body",
            FaultMode::ErrorBody { code: "InternalError".into(), message: "boom".into() },
            (Http, 200, "InternalError", None),
        ),
        (
            "202 polled to Failed",
            FaultMode::async_ending(AsyncOutcome::Failed, 2),
            (AsyncFailed, 200, "InternalServerError", None),
        ),
        (
            "202 polled to Canceled",
            FaultMode::async_ending(AsyncOutcome::Canceled, 0),
            (AsyncFailed, 200, "InternalServerError", None),
        ),
        (
            "202 polled through Location to a failure",
            FaultMode::Async {
                outcome: AsyncOutcome::Failed,
                polls: 1,
                via_location: true,
                retry_after_secs: None,
                error: Some(clb_azure::wire::ErrorBody { code: "QuotaExceeded".into(), message: "no".into() }),
            },
            (AsyncFailed, 500, "QuotaExceeded", None),
        ),
        ("hang", FaultMode::Hang, (Timeout, 0, "", None)),
        ("drop", FaultMode::Drop, (Transport, 0, "", None)),
    ]
}

fn shape(e: &AzureError) -> (ErrorKind, u16, String, Option<u64>) {
    (e.kind, e.status, e.code.clone(), e.retry_after.map(|d| d.as_secs()))
}

/// The state and result of `op` run once, with no fault, on a fresh seeded emulator.
async fn reference(op: Operation) -> (Resources, String) {
    let emulator = emulator();
    seed(&*emulator).await;
    let result = call(&*emulator, op).await.unwrap_or_else(|e| panic!("{op} without a fault: {e}"));
    (emulator.resources(), result)
}

// Upstream TestCreateOrUpdatePIP_Mock, TestDeletePublicIP_Mock, TestDeleteLB_Mock,
// TestUpdateNRPSGWAddressLocations_Mock, TestServiceGatewayClientSynchronousCompletionEndToEnd,
// TestServiceGatewayClientAsyncFailureIsNotSynchronousCompletion,
// TestIsSynchronousCompletion_RejectsErrorBearing200 and TestLocationsUpdater_SendsExactAddressPayloadToNRP.
// Upstream TestCreateOrUpdateLB_Mock, TestDeleteNatGateway_Mock and TestUpdateNRPSGWServices_Mock: their success and
// error subtests, for the load balancer PUT, the NAT gateway delete and the services update among every operation.
// Upstream TestIsSynchronousCompletion: its error statuses, 401 among them, are errors with their status.
#[tokio::test]
async fn every_fault_on_every_operation_gives_the_same_typed_error_over_http_and_in_process_and_loses_nothing() {
    for op in Operation::ALL {
        let (expected_state, expected_result) = reference(op).await;
        for (name, mode, expected) in fault_table() {
            let case = format!("{op} / {name}");
            let expected = (expected.0, expected.1, expected.2.to_owned(), expected.3);

            let in_process = emulator();
            seed(&*in_process).await;
            in_process.set_fault(Fault::times(op, 1, mode.clone()));
            let error = call(&*in_process, op).await.expect_err(&case);
            assert_eq!(shape(&error), expected, "{case}, in-process: {error}");
            assert_eq!(call(&*in_process, op).await.expect(&case), expected_result, "{case}, in-process");
            assert_eq!(in_process.resources(), expected_state, "{case}, in-process");

            let served = emulator();
            let server = serve(served.clone()).await;
            // A short timeout only where a hang is the point.
            let timeout = if mode == FaultMode::Hang { Duration::from_millis(300) } else { Duration::from_secs(30) };
            let client = client(&server.url(), timeout, Credential::None);
            seed(&client).await;
            served.set_fault(Fault::times(op, 1, mode.clone()));
            let error = call(&client, op).await.expect_err(&case);
            assert_eq!(shape(&error), expected, "{case}, over HTTP: {error}");
            assert!(served.state().faults.is_empty(), "{case}: a fault of count 1 is used up");
            assert_eq!(call(&client, op).await.expect(&case), expected_result, "{case}, over HTTP");
            assert_eq!(served.resources(), expected_state, "{case}, over HTTP");
        }
    }
}

/// The NAT gateway rules of the emulator, walked through `api` in upstream's order (docs/upstream.md §c.2.1): public IPs, then the
/// NAT gateway associated with the ServiceGateway, then the Outbound registration naming it; the teardown
/// in reverse, each step refused while the one before it has not happened.
async fn nat_gateway_lifecycle(api: &impl AzureApi, emulator: &Emulator) {
    let refused = |result: Result<(), AzureError>, code: &str| {
        let e = result.expect_err(code);
        assert_eq!((e.status, e.code.as_str()), (400, code), "{e}");
    };
    let partial = UpdateAction::PartialUpdate;
    api.put_public_ip(&pip("egress-a-pip")).await.unwrap();
    api.put_public_ip(&PublicIpSpec { name: "egress-a-pip-v6".into(), version: IpVersion::IPv6 }).await.unwrap();
    let swapped = NatGatewaySpec {
        public_ips: vec!["egress-a-pip-v6".into()],
        public_ips_v6: vec!["egress-a-pip".into()],
        ..nat_gateway("egress-a", true)
    };
    refused(api.put_nat_gateway(&swapped).await, "InvalidRequestFormat");
    let missing = NatGatewaySpec { public_ips: vec!["nowhere-pip".into()], ..nat_gateway("egress-a", true) };
    refused(api.put_nat_gateway(&missing).await, "InvalidResourceReference");
    let on_a_load_balancer = NatGatewaySpec { public_ips: vec!["svc-1-pip".into()], ..nat_gateway("egress-a", true) };
    refused(api.put_nat_gateway(&on_a_load_balancer).await, "PublicIPAddressInUse");
    refused(api.put_load_balancer(&lb("svc-9", "egress-1-pip", vec![])).await, "PublicIPAddressInUse");
    let before = emulator.resources();
    refused(
        api.update_services(partial, &[outbound("egress-a", NatGatewayLink::Set("egress-a".into()))]).await,
        "InvalidResourceReference",
    );
    assert_eq!(emulator.resources(), before, "a refused request changes nothing");

    api.put_nat_gateway(&nat_gateway("egress-a", true)).await.unwrap();
    let listed = api.list_nat_gateways().await.unwrap();
    let a = listed.iter().find(|g| g.name == "egress-a").expect("listed");
    assert_eq!(
        *a,
        ListedNatGateway {
            name: "egress-a".into(),
            public_ips: vec!["egress-a-pip".into()],
            public_ips_v6: vec!["egress-a-pip-v6".into()],
            associated: true,
            as_put: true,
        }
    );
    let names: Vec<&str> = listed.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["egress-1", "egress-a", "spare-natgw"], "every page");
    api.update_services(partial, &[outbound("egress-a", NatGatewayLink::Set("egress-a".into()))]).await.unwrap();

    // The teardown, each step tried before its time first.
    refused(api.delete_nat_gateway("egress-a").await, "InUseNatGatewayCannotBeDeleted");
    refused(api.put_nat_gateway(&nat_gateway("egress-a", false)).await, "NatGatewayInUseByServiceGateway");
    refused(api.delete_public_ip("egress-a-pip").await, "InUsePublicIpAddressCannotBeDeleted");
    api.update_services(partial, &[outbound("egress-a", NatGatewayLink::Clear)]).await.unwrap();
    api.put_nat_gateway(&nat_gateway("egress-a", false)).await.unwrap();
    let listed = api.list_nat_gateways().await.unwrap();
    assert!(!listed.iter().find(|g| g.name == "egress-a").unwrap().associated, "disassociated");
    refused(
        api.update_services(partial, &[outbound("egress-a", NatGatewayLink::Set("egress-a".into()))]).await,
        "NatGatewayNotAssociatedWithServiceGateway",
    );
    api.update_services(partial, &[ServiceRequest { is_delete: true, ..outbound("egress-a", NatGatewayLink::Omit) }])
        .await
        .unwrap();
    api.delete_nat_gateway("egress-a").await.unwrap();
    let gone = api.delete_nat_gateway("egress-a").await.expect_err("deleted");
    assert_eq!(gone.status, 404, "{gone}");
    api.delete_public_ip("egress-a-pip").await.unwrap();
    api.delete_public_ip("egress-a-pip-v6").await.unwrap();
    let resources = emulator.resources();
    assert!(!resources.nat_gateways.contains_key("egress-a") && !resources.services.contains_key("egress-a"));
    assert!(!resources.public_ips.keys().any(|p| p.starts_with("egress-a")));
}

// Upstream TestCreateOrUpdateNatGateway_Mock and TestDeleteNatGateway_Mock: the client PUTs and DELETEs NAT gateways
// (their faults, typed, are the fault table's), and a delete of one that is gone is a 404.
#[tokio::test]
async fn a_nat_gateway_is_created_registered_and_torn_down_only_in_upstreams_order_over_http_and_in_process() {
    let in_process = emulator();
    seed(&*in_process).await;
    nat_gateway_lifecycle(&*in_process, &in_process).await;

    let served = emulator();
    let server = serve(served.clone()).await;
    let client = client(&server.url(), Duration::from_secs(30), Credential::None);
    seed(&client).await;
    nat_gateway_lifecycle(&client, &served).await;
    assert_eq!(served.resources(), in_process.resources());
}

/// A NAT gateway listed with what this host does not make (another SKU, a public IP of another resource group, a
/// failed provisioning, `null` lists) is not `as_put`; one that does not decode is left out of the list.
#[test]
fn a_listed_nat_gateway_is_as_put_only_when_it_is_exactly_what_a_put_makes() {
    let scope = test_scope();
    let net = format!(
        "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network",
        scope.subscription, scope.resource_group
    );
    let listed = |value: serde_json::Value| wire::listed_nat_gateway(&scope, value);
    let ours = serde_json::json!({"name": "egress-a", "sku": {"name": "StandardV2"}, "properties": {
        "publicIpAddresses": [{"id": format!("{net}/publicIPAddresses/egress-a-pip")}],
        "publicIpAddressesV6": null,
        "serviceGateway": {"id": scope.service_gateway_id()},
        "provisioningState": "Succeeded"}});
    let got = listed(ours.clone()).unwrap();
    assert!(got.as_put && got.public_ips == ["egress-a-pip"] && got.public_ips_v6.is_empty(), "{got:?}");
    assert!(got.associated, "associated with this ServiceGateway");
    let with = |pointer: &str, value: serde_json::Value| {
        let mut v = ours.clone();
        *v.pointer_mut(pointer).unwrap() = value;
        listed(v)
    };
    assert!(!with("/sku/name", "Standard".into()).unwrap().as_put);
    assert!(!with("/properties/provisioningState", "Failed".into()).unwrap().as_put);
    let foreign = with("/properties/publicIpAddresses", serde_json::json!([{"id": "/subscriptions/x/resourceGroups/other/providers/Microsoft.Network/publicIPAddresses/egress-a-pip"}])).unwrap();
    assert!(!foreign.as_put && foreign.public_ips.is_empty(), "{foreign:?}");
    assert!(!with("/properties/serviceGateway", serde_json::Value::Null).unwrap().associated, "null");
    let other = serde_json::json!({"id": format!("{net}/serviceGateways/another-clusters")});
    assert!(!with("/properties/serviceGateway", other).unwrap().associated, "another ServiceGateway's");
    assert_eq!(with("/properties", "not an object".into()), None);
    assert_eq!(listed(serde_json::json!({"properties": {}})), None, "no name");
}

// Upstream TestPIPNamesInAzureFromList_IncludesAddressLessPIP: a public IP ARM lists with an address,
// with empty properties (its address not allocated yet) or with no properties at all is there under
// its name, so the start-up sweep sees it; one without a name is left out. Regression: a listed IP
// whose properties lacked the allocation method or the version read as absent, so the IP of a
// Service deleted while its creation was under way was never swept.
#[test]
fn a_listed_public_ip_without_an_address_or_properties_is_still_listed_and_a_nameless_one_is_not() {
    let listed = wire::listed_public_ip;
    let ours = serde_json::json!({"name": "alloc-pip", "sku": {"name": "StandardV2"}, "properties": {
        "publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv6", "ipAddress": "2001:db8::1",
        "provisioningState": "Succeeded"}});
    let got = listed(ours).unwrap();
    assert!(got.as_put && got.version == IpVersion::IPv6 && got.address.as_deref() == Some("2001:db8::1"), "{got:?}");
    let upstreams = serde_json::json!({"name": "alloc-pip", "properties": {"ipAddress": "1.2.3.4"}});
    let got = listed(upstreams).unwrap();
    assert_eq!((got.name.as_str(), got.address.as_deref(), got.as_put), ("alloc-pip", Some("1.2.3.4"), false));
    for (what, value) in [
        ("pending", serde_json::json!({"name": "pending-pip", "properties": {}})),
        ("nilprops", serde_json::json!({"name": "nilprops-pip"})),
        ("null properties", serde_json::json!({"name": "nilprops-pip", "properties": null})),
        ("an empty address", serde_json::json!({"name": "pending-pip", "properties": {"ipAddress": ""}})),
    ] {
        let got = listed(value).unwrap_or_else(|| panic!("{what}: an address-less public IP is listed"));
        assert!(got.address.is_none() && !got.as_put && got.version == IpVersion::IPv4, "{what}: {got:?}");
    }
    assert_eq!(listed(serde_json::json!({"properties": {}})), None, "no name");
    assert_eq!(listed(serde_json::json!({"name": "", "properties": {}})), None, "an empty name");
}

// Regression: one timeout (60 s, not a flag) held every NRP call. Each hung request ends on its
// own side's timeout: were it the other side's (an hour), the test would not end.
// Upstream TestLocationsUpdater_HungSyncTimesOutAndRecovers.
#[tokio::test]
async fn a_hung_nrp_request_ends_on_the_nrp_timeout_and_a_hung_arm_request_on_the_arm_one() {
    let (short, long) = (Duration::from_millis(300), Duration::from_secs(3600));
    for op in
        [Operation::UpdateAddressLocations, Operation::ListServices, Operation::PutPublicIp, Operation::PutLoadBalancer]
    {
        let served = emulator();
        let server = serve(served.clone()).await;
        let mut config = ArmConfig::new(server.url(), test_scope());
        (config.request_timeout, config.nrp_request_timeout) = if op.is_nrp() { (long, short) } else { (short, long) };
        let client = ArmClient::new(config, Credential::None).expect("the client builds");
        seed(&client).await;
        served.set_fault(Fault::times(op, 1, FaultMode::Hang));
        let error = call(&client, op).await.expect_err("the request hangs");
        assert_eq!(error.kind, ErrorKind::Timeout, "{op}: {error}");
    }
}

#[tokio::test]
async fn a_202_polled_to_success_applies_the_request_once_over_both_header_kinds() {
    for op in Operation::ALL {
        let (expected_state, expected_result) = reference(op).await;
        for via_location in [false, true] {
            let served = emulator();
            let server = serve(served.clone()).await;
            let client = client(&server.url(), Duration::from_secs(30), Credential::None);
            seed(&client).await;
            let mode = FaultMode::Async {
                outcome: AsyncOutcome::Succeeded,
                polls: 2,
                via_location,
                retry_after_secs: None,
                error: None,
            };
            served.set_fault(Fault::times(op, 1, mode));
            let result = call(&client, op).await.unwrap_or_else(|e| panic!("{op} via_location={via_location}: {e}"));
            assert_eq!(result, expected_result, "{op} via_location={via_location}");
            assert_eq!(served.resources(), expected_state, "{op} via_location={via_location}");
        }
    }
}

/// A server on a loopback port of its own that answers every request with `answer` and closes the connection;
/// its URL and the request line of each connection it accepted.
fn answering_with(answer: &'static str) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = accepted.clone();
    // Serves until the test process ends.
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            // The whole request is read before answering: closing on an unread body resets the connection.
            let mut request = Vec::new();
            let mut chunk = [0; 4096];
            let head = loop {
                let Ok(read @ 1..) = stream.read(&mut chunk) else { break String::new() };
                request.extend_from_slice(&chunk[..read]);
                let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
                let head = String::from_utf8_lossy(&request[..end]).into_owned();
                let length = head
                    .lines()
                    .filter_map(|line| line.split_once(':'))
                    .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, value)| value.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if request.len() >= end + 4 + length {
                    break head;
                }
            };
            log.lock().unwrap().push(head.lines().next().unwrap_or_default().to_owned());
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    (url, accepted)
}

// Upstream TestIsSynchronousCompletion, TestTolerateSynchronousCompletion and TestUpdateNRPSGWServices_Mock (its
// synchronous-200 cases): a synchronous 200 to a POST is a
// success even when it carries a Location or Azure-AsyncOperation header (real NRP answers so), and is not polled:
// a poll of the header's URL, a closed port, would fail the call.
#[tokio::test]
async fn a_synchronous_200_with_a_polling_header_is_a_success_and_is_not_polled() {
    const ANSWERS: [&str; 2] = [
        "HTTP/1.1 200 OK\r\nLocation: http://127.0.0.1:1/poll\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        "HTTP/1.1 200 OK\r\nAzure-AsyncOperation: http://127.0.0.1:1/poll\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n",
    ];
    for answer in ANSWERS {
        let (url, accepted) = answering_with(answer);
        let client = client(&url, Duration::from_secs(5), Credential::None);
        let header = answer.lines().nth(1).unwrap();
        client
            .update_services(UpdateAction::PartialUpdate, &[inbound("u1")])
            .await
            .unwrap_or_else(|e| panic!("{header}: {e}"));
        let update = location("10.0.0.4", UpdateAction::PartialUpdate, &[("10.244.0.5", &["u1"])]);
        client
            .update_address_locations(UpdateAction::PartialUpdate, &[update])
            .await
            .unwrap_or_else(|e| panic!("{header}: {e}"));
        let accepted = accepted.lock().unwrap().clone();
        assert_eq!(accepted.len(), 2, "{header}: one request per call: {accepted:?}");
        assert!(accepted[0].starts_with("POST ") && accepted[0].contains("/updateServices?"), "{accepted:?}");
        assert!(accepted[1].starts_with("POST ") && accepted[1].contains("/updateAddressLocations?"), "{accepted:?}");
    }
}

#[tokio::test]
async fn polling_waits_the_retry_after_the_server_asks_for() {
    let served = emulator();
    let server = serve(served.clone()).await;
    let client = client(&server.url(), Duration::from_secs(30), Credential::None);
    let mode = FaultMode::Async {
        outcome: AsyncOutcome::Succeeded,
        polls: 1,
        via_location: false,
        retry_after_secs: Some(1),
        error: None,
    };
    served.set_fault(Fault::times(Operation::PutPublicIp, 1, mode));
    let started = Instant::now();
    assert_eq!(client.put_public_ip(&pip("a")).await.unwrap(), "20.0.0.1");
    // The 202 and the one in-progress poll each ask for a second.
    assert!(started.elapsed() >= Duration::from_secs(2), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_fault_matches_only_its_resource_and_always_faults_until_cleared() {
    let emulator = emulator();
    emulator.set_fault(Fault::always(Operation::PutPublicIp, FaultMode::status(409)).on("b"));
    emulator.put_public_ip(&pip("a")).await.unwrap();
    for _ in 0..3 {
        assert_eq!(emulator.put_public_ip(&pip("b")).await.unwrap_err().status, 409);
    }
    assert_eq!(emulator.state().faults.len(), 1);
    emulator.clear_faults();
    assert_eq!(emulator.put_public_ip(&pip("b")).await.unwrap(), "20.0.0.2");
    assert_eq!(emulator.state().requests["put-public-ip"], 5);
}

#[tokio::test]
async fn lists_follow_next_link_across_pages() {
    let served = emulator();
    let server = serve(served.clone()).await;
    let client = client(&server.url(), Duration::from_secs(30), Credential::None);
    let names: Vec<String> = (1..=5).map(|i| format!("svc-{i}")).collect();
    let requests: Vec<ServiceRequest> = names.iter().map(|n| inbound(n)).collect();
    client.update_services(UpdateAction::PartialUpdate, &requests).await.unwrap();
    let listed: Vec<String> = client.list_services().await.unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(listed, ["default-natgw", "svc-1", "svc-2", "svc-3", "svc-4", "svc-5"]);
    assert_eq!(served.state().requests["list-services"], 3, "six services in pages of two");
}

// ---- docs/upstream.md §h.3 semantics, in-process ----

#[tokio::test]
async fn an_upsert_replaces_a_services_properties_wholesale() {
    let emulator = emulator();
    emulator.update_services(UpdateAction::PartialUpdate, &[inbound("svc-1")]).await.unwrap();
    let unlinked = ServiceRequest { backend_pools: vec![], ..inbound("svc-1") };
    emulator.update_services(UpdateAction::PartialUpdate, &[unlinked]).await.unwrap();
    let listed = emulator.list_services().await.unwrap();
    let svc = listed.iter().find(|s| s.name == "svc-1").unwrap();
    assert_eq!(svc.service_type, "Inbound");
    assert!(svc.backend_pool_ids.is_empty(), "{svc:?}");
}

// Upstream TestUpdateLocationsAddresses and TestMapLocationDataToDTO.
#[tokio::test]
async fn address_updates_replace_service_sets_and_empty_lists_remove_addresses_and_locations() {
    let emulator = emulator();
    let services = [inbound("a"), inbound("b")];
    emulator.update_services(UpdateAction::PartialUpdate, &services).await.unwrap();
    let partial = UpdateAction::PartialUpdate;
    let full = UpdateAction::FullUpdate;
    type Step = (
        UpdateAction,
        &'static [(&'static str, &'static [&'static str])],
        &'static [(&'static str, &'static [&'static str])],
    );
    // (location action, addresses sent, addresses of 10.0.0.4 afterwards)
    let steps: &[Step] = &[
        (
            partial,
            &[("10.1.0.1", &["a", "b"]), ("10.1.0.2", &["a"])],
            &[("10.1.0.1", &["a", "b"]), ("10.1.0.2", &["a"])],
        ),
        (partial, &[("10.1.0.1", &["b"])], &[("10.1.0.1", &["b"]), ("10.1.0.2", &["a"])]),
        (partial, &[("10.1.0.2", &[])], &[("10.1.0.1", &["b"])]),
        (full, &[("10.1.0.3", &["a"])], &[("10.1.0.3", &["a"])]),
        (partial, &[("10.1.0.3", &[])], &[]),
    ];
    for (i, (action, sent, after)) in steps.iter().enumerate() {
        let update = location("10.0.0.4", *action, sent);
        emulator.update_address_locations(partial, &[update]).await.unwrap();
        let expected: Vec<ListedLocation> = if after.is_empty() {
            vec![]
        } else {
            vec![ListedLocation {
                location: "10.0.0.4".into(),
                addresses: after
                    .iter()
                    .map(|(a, s)| AddressServices {
                        address: (*a).into(),
                        services: s.iter().map(|s| (*s).into()).collect(),
                    })
                    .collect(),
            }]
        };
        assert_eq!(emulator.list_address_locations().await.unwrap(), expected, "step {i}");
    }
    emulator
        .update_address_locations(partial, &[location("10.0.0.4", partial, &[("10.1.0.1", &["a"])])])
        .await
        .unwrap();
    emulator.update_address_locations(partial, &[location("10.0.0.4", partial, &[])]).await.unwrap();
    assert!(emulator.resources().locations.is_empty(), "addresses: [] removes the location");
}

// Upstream TestBuildInboundServiceResources_DuplicateBackendPortRejected.
#[tokio::test]
async fn rejected_requests_carry_their_arm_code_and_change_nothing() {
    let emulator = emulator();
    seed(&*emulator).await;
    let before = emulator.resources();
    let partial = UpdateAction::PartialUpdate;
    let v6_twice = [
        location("fd00::4", partial, &[("fd00:1::5", &["svc-1"])]),
        location("FD00:0:0::4", partial, &[("fd00:1::6", &["svc-1"])]),
    ];
    let cases: Vec<(&str, Result<(), AzureError>, u16, &str)> = vec![
        (
            "the same location twice, spelt two ways",
            emulator.update_address_locations(partial, &v6_twice).await,
            400,
            "DuplicateLocationsInRequest",
        ),
        (
            "an IPv6 address at an IPv4 location",
            emulator
                .update_address_locations(partial, &[location("10.0.0.4", partial, &[("fd00::9", &["svc-1"])])])
                .await,
            400,
            "AddressFamilyMismatch",
        ),
        (
            "an address referencing an unregistered service",
            emulator
                .update_address_locations(partial, &[location("10.0.0.4", partial, &[("10.244.0.9", &["nope"])])])
                .await,
            400,
            "ServiceNotFound",
        ),
        (
            "unregistering a service still referenced",
            emulator.update_services(partial, &[unregister("svc-1")]).await,
            400,
            "ServiceWithOverlayMappingsCannotBeDeleted",
        ),
        (
            "unregistering a missing service",
            emulator.update_services(partial, &[unregister("nope")]).await,
            404,
            "NotFound",
        ),
        (
            "touching the RP's default service",
            emulator.update_services(partial, &[unregister("default-natgw")]).await,
            400,
            "MultipleDefaultServicesNotAllowedInServiceGateway",
        ),
        ("deleting a missing public IP", emulator.delete_public_ip("nope").await, 404, "ResourceNotFound"),
        (
            "deleting a public IP a load balancer uses",
            emulator.delete_public_ip("svc-1-pip").await,
            400,
            "InUsePublicIpAddressCannotBeDeleted",
        ),
        ("deleting a missing load balancer", emulator.delete_load_balancer("nope").await, 404, "ResourceNotFound"),
        (
            "a load balancer on a missing public IP",
            emulator.put_load_balancer(&lb("svc-9", "nope-pip", vec![])).await,
            400,
            "InvalidResourceReference",
        ),
        (
            "two rules on one backend port and protocol",
            emulator
                .put_load_balancer(&lb(
                    "svc-1",
                    "svc-1-pip",
                    vec![rule(Protocol::Tcp, 80), LbRule { frontend_port: 81, ..rule(Protocol::Tcp, 80) }],
                ))
                .await,
            400,
            "RulesUseSameBackendPortProtocolAndPool",
        ),
    ];
    for (case, result, status, code) in cases {
        let error = result.expect_err(case);
        assert_eq!((error.kind, error.status, error.code.as_str()), (ErrorKind::Http, status, code), "{case}: {error}");
    }
    assert_eq!(emulator.resources(), before, "a rejected request is not applied, not even in part");
}

// Upstream TestDeleteLB_Mock, TestBuildServiceGatewayRemovalDTO (its inbound half; outbound removals are
// the outbound lifecycle's) and TestRemoveBackendPoolReferenceFromServicesDTO.
#[tokio::test]
async fn a_drained_service_can_be_unregistered_and_its_load_balancer_and_ip_deleted_in_ccm_order() {
    let emulator = emulator();
    seed(&*emulator).await;
    let partial = UpdateAction::PartialUpdate;
    emulator.update_address_locations(partial, &[location("10.0.0.4", partial, &[("10.244.0.5", &[])])]).await.unwrap();
    let unlink = ServiceRequest { backend_pools: vec![], ..inbound("svc-1") };
    emulator.update_services(partial, &[unlink]).await.unwrap();
    emulator.delete_load_balancer("svc-1").await.unwrap();
    emulator.delete_load_balancer("spare-lb").await.unwrap();
    emulator.update_services(partial, &[unregister("svc-1")]).await.unwrap();
    emulator.delete_public_ip("svc-1-pip").await.unwrap();
    let resources = emulator.resources();
    assert_eq!(resources.services.keys().collect::<Vec<_>>(), ["default-natgw"]);
    assert!(resources.load_balancers.is_empty() && resources.backend_pools.is_empty());
    assert_eq!(resources.public_ips.keys().collect::<Vec<_>>(), ["egress-1-pip", "egress-1-pip-v6", "spare-pip"]);
}

// Upstream TestBuildInboundServiceResources_SameBackendPortDifferentProtocolAllowed.
#[tokio::test]
async fn tcp_and_udp_may_share_a_backend_port() {
    let emulator = emulator();
    emulator.put_public_ip(&pip("p")).await.unwrap();
    emulator.put_load_balancer(&lb("l", "p", vec![rule(Protocol::Tcp, 53), rule(Protocol::Udp, 53)])).await.unwrap();
    assert_eq!(emulator.resources().load_balancers["l"].rules.len(), 2);
}

#[tokio::test]
async fn public_ips_are_allocated_deterministically_and_kept_on_re_put() {
    let emulator = emulator();
    let v6 = PublicIpSpec { name: "c".into(), version: IpVersion::IPv6 };
    assert_eq!(emulator.put_public_ip(&pip("a")).await.unwrap(), "20.0.0.1");
    assert_eq!(emulator.put_public_ip(&pip("b")).await.unwrap(), "20.0.0.2");
    assert_eq!(emulator.put_public_ip(&v6).await.unwrap(), "2603:1030::1");
    assert_eq!(emulator.put_public_ip(&pip("a")).await.unwrap(), "20.0.0.1");
}

async fn stale_etag_case(api: &impl AzureApi, emulator: &Emulator, label: &str) {
    seed(api).await;
    let (pool, etag) = api.get_backend_pool(&svc1_pool()).await.unwrap();
    let lb_etag = emulator.resources().load_balancers["svc-1"].etag.clone();
    let mut changed = pool.clone();
    changed.addresses.push(BackendAddress { name: "n1".into(), ip_address: "10.0.0.4".into() });
    api.put_backend_pool(&svc1_pool(), &changed, Some(&etag)).await.unwrap();
    let error = api.put_backend_pool(&svc1_pool(), &pool, Some(&etag)).await.unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (412, "PreconditionFailed"), "{label}: {error}");
    let resources = emulator.resources();
    assert_eq!(resources.backend_pools["svc-1/svc-1"].addresses.len(), 1, "{label}: the stale write did not land");
    assert_ne!(
        resources.load_balancers["svc-1"].etag, lb_etag,
        "{label}: a pool write changes its load balancer's ETag"
    );
    let (read_back, new_etag) = api.get_backend_pool(&svc1_pool()).await.unwrap();
    assert_eq!(read_back.addresses, changed.addresses, "{label}");
    assert_ne!(new_etag, etag, "{label}");
}

#[tokio::test]
async fn a_backend_pool_write_with_a_stale_etag_is_refused_with_412() {
    let in_process = emulator();
    stale_etag_case(&*in_process, &in_process, "in-process").await;
    let served = emulator();
    let server = serve(served.clone()).await;
    stale_etag_case(&client(&server.url(), Duration::from_secs(30), Credential::None), &served, "over HTTP").await;
}

#[tokio::test]
async fn ipv6_locations_are_keyed_canonically_whatever_the_spelling() {
    let upper =
        Arc::new(Emulator::with_config(test_scope(), EmulatorConfig { echo_ipv6_upper: true, ..Default::default() }));
    for emulator in [emulator(), upper] {
        let partial = UpdateAction::PartialUpdate;
        emulator.update_services(partial, &[inbound("a"), inbound("b")]).await.unwrap();
        let first = location("FD00:0:0:0:0:0:0:4", partial, &[("fd00:0::A", &["a"])]);
        emulator.update_address_locations(partial, &[first]).await.unwrap();
        let second = location("fd00::4", partial, &[("FD00::a", &["b"])]);
        emulator.update_address_locations(partial, &[second]).await.unwrap();
        let resources = emulator.resources();
        assert_eq!(resources.locations.len(), 1, "{:?}", resources.locations);
        assert_eq!(resources.locations["fd00::4"]["fd00::a"].iter().collect::<Vec<_>>(), ["b"]);
        let listed = emulator.list_address_locations().await.unwrap();
        let expected = if emulator.config().echo_ipv6_upper { ("FD00::4", "FD00::A") } else { ("fd00::4", "fd00::a") };
        assert_eq!((listed[0].location.as_str(), listed[0].addresses[0].address.as_str()), expected);
    }
}

// ---- wire format ----

// Upstream TestBuildInboundServiceResources_WithConfig, TestRoundTripServiceToResourcesAndBack and
// TestBuildInboundServiceResources_NoProbesForPodIPBackend, their ARM side (the guest's
// tracker.rs tests pin the names and rules): a StandardV2 public IP, a `Service` SKU load
// balancer whose frontend references that public IP and whose one pool is named after the
// Service, rules without floating IP, no probes; the NRP registration as Inbound with that pool.
// Upstream TestCreateOrUpdatePIP_Mock, TestUpdateNRPSGWAddressLocations_Mock,
// TestConvertServicesUpdateActionToARM, TestConvertLocationsUpdateActionToARM,
// TestConvertLocationDTOsToAddressLocations, TestConvertServiceDTOsToServiceRequests_VNetResourceGroup,
// TestDisassociateNatGateway_ClearsReferencesOnTheWire (its ServiceGateway side, publicNatGatewayId null;
// NAT gateways are the outbound lifecycle's), TestConvertServiceDTOsToServiceRequests_MapsServiceType (its
// inbound half; Outbound requests naming a NAT gateway are the outbound lifecycle's),
// TestBuildInboundServiceResources_BackendPoolNaming, TestBuildInboundServiceResources_ResourceIDs,
// TestBuildInboundServiceResources_IPFamilies, TestLocationsUpdater_SendsExactAddressPayloadToNRP,
// TestGuardSyncOps_PerAddressRemoval_EmptyServiceRef, TestGuardSyncOps_WholeNodeRemoval_EmitsEmptyAddresses,
// TestJSONRoundTrip, TestMapLocationDataToDTO and TestBackendPoolPopulation.
// Upstream TestUpdateNRPSGWServices_Mock: an unregistration goes as isDelete true with no pools.
// Upstream TestGuardV9WireValues_InboundResources and TestGuardV9WireValues_EnumStrings: the load balancer's scope
// is "Public", which is what makes refusing internal load balancers safe (the NAT gateway's SKU is pinned below).
// Upstream TestSDKV9WireValues: the protocols go as "Tcp" and "Udp".
// Upstream TestBuildInboundServiceResources_TCPHasResetEnabled: a TCP rule's enableTcpReset is on the wire, true.
// Upstream TestNRPDrainVsRemoveWireShapes, its ARM half: a drained address goes with "services": [] and
// a location left without pods with "addresses": [], both present, never null or omitted.
// Upstream TestCompleteServiceCreationWorkflow: the public IP and the load balancer are put in the configured region.
// Upstream TestCreateOrUpdateLB_Mock: the load balancer built is the JSON sent.
// Upstream TestResourceIDsAreConsistent: each rule's frontend ID is that of the load balancer's one frontend.
// Upstream TestGuardV9WireValues_OutboundResources: a NAT gateway goes as SKU StandardV2 with its public IPs by
// ARM ID and its serviceGateway reference (an explicit null to disassociate).
#[test]
fn requests_serialise_as_the_arm_json_with_empty_lists_present_and_null_to_clear() {
    let partial = UpdateAction::PartialUpdate;
    let disassociate = outbound("egress-1", NatGatewayLink::Clear);
    let services = wire::update_services(&test_scope(), partial, &[inbound("u1"), disassociate, unregister("u2")]);
    let net = "/subscriptions/sub-1/resourceGroups/rg-1/providers/Microsoft.Network";
    let expected = serde_json::json!({
        "action": "PartialUpdate",
        "serviceRequests": [
            {"isDelete": false, "service": {"name": "u1", "properties": {"serviceType": "Inbound", "loadBalancerBackendPools": [
                {"id": format!("{net}/loadBalancers/u1/backendAddressPools/u1"), "name": "u1",
                 "properties": {"virtualNetwork": {"id": "/subscriptions/sub-1/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet-1"}}}
            ]}}},
            {"isDelete": false, "service": {"name": "egress-1", "properties": {"serviceType": "Outbound", "loadBalancerBackendPools": [], "publicNatGatewayId": null}}},
            {"isDelete": true, "service": {"name": "u2", "properties": {"serviceType": "Inbound", "loadBalancerBackendPools": []}}}
        ]
    });
    assert_eq!(serde_json::to_value(&services).unwrap(), expected);

    let locations = wire::update_address_locations(
        partial,
        &[location("10.0.0.4", partial, &[]), location("10.0.0.5", UpdateAction::FullUpdate, &[("10.1.0.1", &[])])],
    );
    let expected = serde_json::json!({
        "action": "PartialUpdate",
        "addressLocations": [
            {"addressLocation": "10.0.0.4", "addressUpdateAction": "PartialUpdate", "addresses": []},
            {"addressLocation": "10.0.0.5", "addressUpdateAction": "FullUpdate", "addresses": [{"address": "10.1.0.1", "services": []}]}
        ]
    });
    assert_eq!(serde_json::to_value(&locations).unwrap(), expected);

    let spec = lb("u1", "u1-pip", vec![rule(Protocol::Tcp, 80), rule(Protocol::Udp, 53)]);
    let balancer = serde_json::to_value(wire::load_balancer(&test_scope(), &spec)).unwrap();
    assert_eq!(balancer["sku"]["name"], "Service");
    assert_eq!(balancer["properties"]["scope"], "Public");
    assert_eq!(balancer["location"], test_scope().location.as_str());
    assert_eq!(balancer["properties"]["frontendIPConfigurations"][0]["name"], "frontend");
    assert_eq!(balancer["properties"]["loadBalancingRules"][0]["properties"]["protocol"], "Tcp");
    // A TCP rule's reset goes on the wire, present and true (an omitted field would leave it off).
    assert_eq!(balancer["properties"]["loadBalancingRules"][0]["properties"]["enableTcpReset"], true);
    let rule_json = &balancer["properties"]["loadBalancingRules"][1];
    assert_eq!(rule_json["name"], "rule-udp-53");
    assert_eq!(rule_json["properties"]["protocol"], "Udp");
    assert_eq!(
        rule_json["properties"]["frontendIPConfiguration"]["id"],
        format!("{net}/loadBalancers/u1/frontendIPConfigurations/frontend")
    );
    assert_eq!(rule_json["properties"]["enableFloatingIP"], false);
    assert_eq!(rule_json["properties"]["idleTimeoutInMinutes"], 4);
    assert_eq!(rule_json["properties"].get("probe"), None, "pod IP backends take no health probe");
    assert_eq!(balancer["properties"].get("probes"), None);
    assert_eq!(
        balancer["properties"]["frontendIPConfigurations"][0]["properties"]["publicIPAddress"]["id"],
        format!("{net}/publicIPAddresses/u1-pip"),
        "the frontend is the Service's own public IP"
    );
    assert_eq!(balancer["properties"]["backendAddressPools"][0]["name"], "u1");
    assert_eq!(
        rule_json["properties"]["backendAddressPool"]["id"],
        format!("{net}/loadBalancers/u1/backendAddressPools/u1")
    );
    let address = serde_json::to_value(wire::public_ip(
        &test_scope(),
        &PublicIpSpec { name: "x".into(), version: IpVersion::IPv6 },
    ))
    .unwrap();
    assert_eq!(address["location"], test_scope().location.as_str());
    assert_eq!(address["sku"]["name"], "StandardV2");
    assert_eq!(address["properties"]["publicIPAllocationMethod"], "Static");
    assert_eq!(address["properties"]["publicIPAddressVersion"], "IPv6");

    // The NAT gateway half of the disassociation: serviceGateway goes as an explicit null.
    let gateway =
        |associated| serde_json::to_value(wire::nat_gateway(&test_scope(), &nat_gateway("e", associated))).unwrap();
    let expected = serde_json::json!({
        "location": test_scope().location,
        "sku": {"name": "StandardV2"},
        "properties": {
            "publicIpAddresses": [{"id": format!("{net}/publicIPAddresses/e-pip")}],
            "publicIpAddressesV6": [{"id": format!("{net}/publicIPAddresses/e-pip-v6")}],
            "serviceGateway": {"id": format!("{net}/serviceGateways/{}", test_scope().service_gateway)}
        }
    });
    assert_eq!(gateway(true), expected);
    assert_eq!(gateway(false)["properties"]["serviceGateway"], serde_json::Value::Null);
    assert!(gateway(false)["properties"].as_object().unwrap().contains_key("serviceGateway"));
}

// Upstream TestParseLocationAddresses_ReadsAddressesAndServices: a listed address's services are read, one listed
// without services is bound to none, and one without an address is skipped; none of them fails the listing.
#[test]
fn a_listed_address_without_services_is_bound_to_none_and_a_null_address_is_skipped() {
    let text = r#"{"addressLocation": "10.0.0.1", "addresses": [
        {"address": "10.244.0.5", "services": ["svc-a", "svc-b"]},
        {"address": "10.244.0.6"},
        {"address": "10.244.0.7", "services": null},
        {"address": null, "services": ["svc-a"]}
    ]}"#;
    let listed = wire::listed_location(serde_json::from_str::<wire::AddressLocationResponse>(text).unwrap());
    assert_eq!(listed.location, "10.0.0.1");
    let addresses: Vec<(&str, Vec<&str>)> = listed
        .addresses
        .iter()
        .map(|a| (a.address.as_str(), a.services.iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(addresses, [("10.244.0.5", vec!["svc-a", "svc-b"]), ("10.244.0.6", vec![]), ("10.244.0.7", vec![])]);
    let bare = r#"{"addressLocation": "10.0.0.2", "addresses": null}"#;
    let listed = wire::listed_location(serde_json::from_str::<wire::AddressLocationResponse>(bare).unwrap());
    assert!(listed.addresses.is_empty());
}

// ---- credentials ----

fn temp_dir() -> std::path::PathBuf {
    let dir = clb_tests::process_dir().join(format!("azure-{:?}", std::thread::current().id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn last_bearer(emulator: &Emulator) -> Option<String> {
    emulator.state().log.last().and_then(|entry| entry.bearer.clone())
}

#[tokio::test]
async fn a_token_file_is_sent_as_the_bearer_and_re_read_when_it_changes() {
    let path = temp_dir().join("token");
    std::fs::write(&path, "first-token\n").unwrap();
    let emulator = emulator();
    let server = serve(emulator.clone()).await;
    let client = client(&server.url(), Duration::from_secs(30), Credential::TokenFile(TokenFile::new(&path)));
    client.list_services().await.unwrap();
    assert_eq!(last_bearer(&emulator).as_deref(), Some("first-token"));
    // A different length, so that the change shows even where mtime is coarse.
    std::fs::write(&path, "the-second-token").unwrap();
    client.list_services().await.unwrap();
    assert_eq!(last_bearer(&emulator).as_deref(), Some("the-second-token"));
    std::fs::write(&path, "  \n").unwrap();
    let error = client.list_services().await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Auth, "{error}");
}

fn workload_identity(authority: &str, federated: &std::path::Path) -> WorkloadIdentity {
    let env = [
        ("AZURE_CLIENT_ID", "client-1".to_owned()),
        ("AZURE_TENANT_ID", "tenant-1".to_owned()),
        ("AZURE_FEDERATED_TOKEN_FILE", federated.display().to_string()),
        ("AZURE_AUTHORITY_HOST", format!("{authority}/")),
    ];
    WorkloadIdentity::from_env(|name| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())).unwrap()
}

#[tokio::test]
async fn workload_identity_exchanges_the_federated_token_once_and_caches_the_arm_token() {
    let federated = temp_dir().join("federated");
    std::fs::write(&federated, "service-account-jwt").unwrap();
    let emulator = emulator();
    let server = serve(emulator.clone()).await;
    let credential = Credential::WorkloadIdentity(workload_identity(&server.url(), &federated));
    let client = client(&server.url(), Duration::from_secs(30), credential);
    client.list_services().await.unwrap();
    client.list_address_locations().await.unwrap();
    let exchanges = emulator.state().token_exchanges;
    assert_eq!(exchanges.len(), 1, "{exchanges:?}");
    let exchange = &exchanges[0];
    assert_eq!(
        (exchange.tenant.as_str(), exchange.client_id.as_str(), exchange.assertion.as_str(), exchange.scope.as_str()),
        ("tenant-1", "client-1", "service-account-jwt", "https://management.azure.com/.default")
    );
    assert_eq!(last_bearer(&emulator).as_deref(), Some("emulator-token-1"));
}

#[tokio::test]
async fn workload_identity_exchanges_again_near_expiry_with_the_rotated_federated_token() {
    let federated = temp_dir().join("federated-rotating");
    std::fs::write(&federated, "jwt-1").unwrap();
    // Tokens that live less than the refresh margin are never reused.
    let config = EmulatorConfig { token_lifetime_secs: 60, ..Default::default() };
    let emulator = Arc::new(Emulator::with_config(test_scope(), config));
    let server = serve(emulator.clone()).await;
    let credential = Credential::WorkloadIdentity(workload_identity(&server.url(), &federated));
    let client = client(&server.url(), Duration::from_secs(30), credential);
    client.list_services().await.unwrap();
    std::fs::write(&federated, "jwt-2").unwrap();
    client.list_services().await.unwrap();
    let assertions: Vec<String> = emulator.state().token_exchanges.into_iter().map(|e| e.assertion).collect();
    assert_eq!(assertions, ["jwt-1", "jwt-2"]);
    assert_eq!(last_bearer(&emulator).as_deref(), Some("emulator-token-2"));
}

#[tokio::test]
async fn a_refused_token_exchange_is_an_auth_error_and_no_arm_request_is_sent() {
    let federated = temp_dir().join("federated-refused");
    std::fs::write(&federated, "jwt").unwrap();
    let emulator = emulator();
    let server = serve(emulator.clone()).await;
    let mut identity = workload_identity(&server.url(), &federated);
    identity.scope = "https://management.azure.com/wrong".into();
    let client = client(&server.url(), Duration::from_secs(30), Credential::WorkloadIdentity(identity));
    let error = client.list_services().await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Auth);
    assert!(error.message.contains("invalid_scope"), "{error}");
    assert!(emulator.state().requests.is_empty());
}

#[test]
fn workload_identity_names_the_missing_environment_variable() {
    let error = WorkloadIdentity::from_env(|name| (name == "AZURE_CLIENT_ID").then(|| "c".to_owned())).err().unwrap();
    assert_eq!(error.to_string(), "workload identity needs the environment variable AZURE_TENANT_ID");
}

// ---- the command ----

#[tokio::test]
async fn clb_host_emulator_prints_the_bound_address_and_serves_the_arm_routes_there() {
    let (sender, lines) = std::sync::mpsc::channel();
    // Serves until the test process ends, as it would until killed.
    std::thread::spawn(move || {
        let mut out = clb_tests::LineSender(sender, Vec::new());
        let args =
            ["clb-host", "emulator", "--listen", "127.0.0.1:0", "--subscription", "sub-1", "--resource-group", "rg-1"];
        clb_host::cli::run(args, &mut out, &mut std::io::sink())
    });
    let line = tokio::task::spawn_blocking(move || lines.recv_timeout(Duration::from_secs(60)).expect("a line"))
        .await
        .unwrap();
    let url = line.strip_prefix("listening on ").unwrap_or_else(|| panic!("{line}"));
    assert!(url.starts_with("http://127.0.0.1:") && !url.ends_with(":0"), "{line}");
    let listed = client(url, Duration::from_secs(30), Credential::None).list_services().await.unwrap();
    assert_eq!(listed.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["default-natgw"]);
}

#[test]
fn clb_host_emulator_exits_two_when_it_cannot_listen() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let mut err = Vec::new();
    let code = clb_host::cli::run(["clb-host", "emulator", "--listen", &address], &mut std::io::sink(), &mut err);
    assert_eq!(code, clb_host::cli::EXIT_BAD_INPUT);
    assert!(String::from_utf8_lossy(&err).contains(&format!("cannot listen on {address}")));
}

// Regression: the emulator buffered a request body of any size (a 2 GB body took 4 GB of
// memory). Past its limit a body is answered 413 without being read on, and
// the emulator serves the next request.
#[tokio::test]
async fn the_emulator_answers_a_body_over_its_limit_with_413_and_keeps_serving() {
    use clb_emulator::server::MAX_REQUEST_BYTES;
    let served = emulator();
    let server = serve(served.clone()).await;
    let http = reqwest::Client::new();
    let url = format!("{}/emulator/faults", server.url());
    let answer = http.post(&url).body(vec![b' '; MAX_REQUEST_BYTES + 1]).send().await.expect("an answer");
    assert_eq!(answer.status().as_u16(), 413);
    let text = answer.text().await.unwrap();
    assert!(text.contains("RequestEntityTooLarge") && text.contains(&MAX_REQUEST_BYTES.to_string()), "{text}");
    let state = http.get(format!("{}/emulator/state", server.url())).send().await.expect("still serving");
    assert_eq!(state.status().as_u16(), 200);
}

// Upstream TestBuildInboundServiceResources_WithConfig and TestBuildOutboundServiceResources_Basic, their
// NetworkResourceSubscriptionID: with the cloud config's `networkResourceSubscriptionID`, the public IP, load
// balancer, pool, VNet, NAT gateway and ServiceGateway IDs in every request are under that subscription, and so
// are the requests' URLs (the emulator of that subscription answers them; its cluster subscription's URLs are
// not its).
#[tokio::test]
async fn a_network_resource_subscription_holds_every_id_and_url_of_the_network_resources() {
    let text = "subscriptionId: cluster-sub\nnetworkResourceSubscriptionID: network-sub\nresourceGroup: rg-1\n\
                location: eastus2\nvnetName: vnet-1\n";
    let path = std::path::Path::new("azure.json");
    let scope = clb_executor::inputs::parse_scope(path, text, DEFAULT_SERVICE_GATEWAY).unwrap();
    let net = "/subscriptions/network-sub/resourceGroups/rg-1/providers/Microsoft.Network";

    let requests = [inbound("u1"), outbound("egress-1", NatGatewayLink::Set("egress-1".into()))];
    let services = serde_json::to_value(wire::update_services(&scope, UpdateAction::PartialUpdate, &requests)).unwrap();
    let pool = &services["serviceRequests"][0]["service"]["properties"]["loadBalancerBackendPools"][0];
    assert_eq!(pool["id"], format!("{net}/loadBalancers/u1/backendAddressPools/u1"));
    assert_eq!(pool["properties"]["virtualNetwork"]["id"], format!("{net}/virtualNetworks/vnet-1"));
    let nat_id = &services["serviceRequests"][1]["service"]["properties"]["publicNatGatewayId"];
    assert_eq!(nat_id, &serde_json::json!(format!("{net}/natGateways/egress-1")));

    let balancer =
        serde_json::to_value(wire::load_balancer(&scope, &lb("u1", "u1-pip", vec![rule(Protocol::Tcp, 80)])));
    let balancer = balancer.unwrap();
    let frontend = &balancer["properties"]["frontendIPConfigurations"][0];
    assert_eq!(frontend["properties"]["publicIPAddress"]["id"], format!("{net}/publicIPAddresses/u1-pip"));
    let rule_json = &balancer["properties"]["loadBalancingRules"][0]["properties"];
    let frontend_id = format!("{net}/loadBalancers/u1/frontendIPConfigurations/frontend");
    assert_eq!(rule_json["frontendIPConfiguration"]["id"], frontend_id);
    assert_eq!(rule_json["backendAddressPool"]["id"], format!("{net}/loadBalancers/u1/backendAddressPools/u1"));

    let nat = serde_json::to_value(wire::nat_gateway(&scope, &nat_gateway("egress-1", true))).unwrap();
    assert_eq!(nat["properties"]["publicIpAddresses"][0]["id"], format!("{net}/publicIPAddresses/egress-1-pip"));
    assert_eq!(nat["properties"]["serviceGateway"]["id"], format!("{net}/serviceGateways/{DEFAULT_SERVICE_GATEWAY}"));
    let listed = wire::listed_nat_gateway(
        &scope,
        serde_json::json!({"name": "egress-1", "sku": nat["sku"],
        "properties": nat["properties"]}),
    );
    let listed = listed.unwrap();
    assert!(listed.as_put && listed.associated, "read back under the same subscription: {listed:?}");

    let emulator = Arc::new(Emulator::new(scope.clone()));
    let server = serve(emulator.clone()).await;
    let mut config = ArmConfig::new(server.url(), scope.clone());
    config.poll_interval = Duration::from_millis(10);
    let api = ArmClient::new(config, Credential::None).unwrap();
    seed(&api).await;
    let resources = emulator.resources();
    assert!(resources.public_ips.contains_key("svc-1-pip") && resources.nat_gateways.contains_key("egress-1"));
    assert_eq!(api.list_load_balancers().await.unwrap().len(), 2);
    let cluster = Scope { subscription: "cluster-sub".into(), ..scope };
    let wrong = ArmClient::new(ArmConfig::new(server.url(), cluster), Credential::None).unwrap();
    let refused = wrong.put_public_ip(&pip("x-pip")).await.unwrap_err();
    assert_eq!(refused.status, 404, "{refused:?}");
}

// Multi-SLB placement finds the pools a Service left in the listing of load balancers: ARM's list
// names every backend pool of each (a pool made and one deleted since included), over HTTP with
// pages to follow as in process.
#[tokio::test]
async fn the_listing_of_load_balancers_names_the_backend_pools_of_each_over_http_and_in_process() {
    let emulator = emulator();
    let server = serve(emulator.clone()).await;
    let http = client(&server.url(), Duration::from_secs(10), Credential::None);
    seed(emulator.as_ref()).await;
    let made = PoolRef { load_balancer: "svc-1".into(), pool: "shop-web".into() };
    emulator.put_backend_pool(&made, &BackendPool::default(), None).await.unwrap();
    let gone = PoolRef { load_balancer: "spare-lb".into(), pool: "shop-api".into() };
    emulator.put_backend_pool(&gone, &BackendPool::default(), None).await.unwrap();
    emulator.delete_backend_pool(&gone).await.unwrap();
    let pools = |listed: Vec<ListedLoadBalancer>| -> Vec<(String, Vec<String>)> {
        listed.into_iter().map(|lb| (lb.name, lb.pools)).collect()
    };
    let want = vec![
        ("spare-lb".to_owned(), vec!["spare-lb".to_owned()]),
        ("svc-1".to_owned(), vec!["svc-1".to_owned(), "shop-web".to_owned()]),
    ];
    assert_eq!(pools(emulator.list_load_balancers().await.unwrap()), want, "in process");
    assert_eq!(pools(http.list_load_balancers().await.unwrap()), want, "over HTTP");
}

#[tokio::test]
async fn the_listings_name_each_load_balancers_frontends_and_what_each_public_ip_is_attached_to_over_http_and_in_process()
 {
    let emulator = emulator();
    let server = serve(emulator.clone()).await;
    let http = client(&server.url(), Duration::from_secs(10), Credential::None);
    let scope = test_scope();
    let mut tagged = wire::public_ip(&scope, &pip("lb1-pip"));
    tagged.tags = Some([("k8s-azure-cluster-name".to_owned(), "azure".to_owned())].into());
    emulator.put_public_ip_body("lb1-pip", &tagged).unwrap();
    http.put_public_ip(&pip("free-pip")).await.unwrap();
    let mut body = wire::load_balancer(&scope, &lb("lb1", "lb1-pip", vec![]));
    body.properties.frontend_ip_configurations.push(wire::FrontendIpConfiguration {
        name: "ilb".into(),
        properties: wire::FrontendIpProperties {
            public_ip_address: None,
            private_ip_address: Some("10.240.0.50".into()),
        },
    });
    emulator.put_load_balancer_body("lb1", &body).unwrap();
    let frontend = |name: &str, private_ip: Option<&str>| ListedFrontend {
        name: name.into(),
        private_ip: private_ip.map(str::to_owned),
    };
    let attached = format!("{}/frontendIPConfigurations/{FRONTEND_NAME}", scope.load_balancer_id("lb1"));
    for (how, load_balancers, public_ips) in [
        ("in process", emulator.list_load_balancers().await.unwrap(), emulator.list_public_ips().await.unwrap()),
        ("over HTTP", http.list_load_balancers().await.unwrap(), http.list_public_ips().await.unwrap()),
    ] {
        let [lb1] = load_balancers.as_slice() else { panic!("{how}: {load_balancers:?}") };
        assert_eq!(lb1.frontends, [frontend(FRONTEND_NAME, None), frontend("ilb", Some("10.240.0.50"))], "{how}");
        // Two frontends are more than a Service's load balancer has: not one of this controller's.
        assert_eq!(lb1.shape, None, "{how}");
        let by_name =
            |name: &str| public_ips.iter().find(|ip| ip.name == name).unwrap_or_else(|| panic!("{how}: {name}"));
        assert_eq!(by_name("lb1-pip").ip_configuration.as_deref(), Some(attached.as_str()), "{how}");
        assert_eq!(by_name("lb1-pip").tags, [("k8s-azure-cluster-name".to_owned(), "azure".to_owned())], "{how}");
        assert_eq!(
            (by_name("free-pip").ip_configuration.clone(), by_name("free-pip").tags.clone()),
            (None, vec![]),
            "{how}"
        );
    }
    // A frontend with neither a public IP nor a private address is refused, as ARM refuses it.
    body.properties.frontend_ip_configurations[1].properties.private_ip_address = None;
    let refused = emulator.put_load_balancer_body("lb1", &body).unwrap_err();
    assert!(refused.to_string().contains("neither a public IP nor a private address"), "{refused}");
}
