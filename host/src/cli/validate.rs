//! `clb-host validate`: the configuration and admission rules on files, through the component.

use super::args::{EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, LogicArgs};
use clb_executor::{inputs, records};
use clb_sandbox::Runtime;
use clb_sandbox::bindings::clb::reconciler::types::Mode;
use clb_sandbox::bindings::exports::clb::reconciler::validation::Verdict;
use k8s_openapi::api::core::v1::Service;
use std::io::Write;
use std::path::PathBuf;

/// The mode as the WIT spells it.
pub(super) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::ContainerLoadBalancer => "container-load-balancer",
        Mode::MultiSlbLocalServices => "multi-slb-local-services",
        Mode::Inactive => "inactive",
    }
}

pub(super) fn validate(
    config_path: &std::path::Path,
    service_paths: &[PathBuf],
    logic: &LogicArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<u8> {
    let config = match inputs::read_config(config_path) {
        Ok(config) => config,
        Err(e) => {
            writeln!(err, "error: {e}")?;
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let mut services = Vec::new();
    for path in service_paths {
        match inputs::read_manifests::<Service>(path) {
            Ok(found) => services.extend(found.into_iter().map(|svc| (path, svc))),
            Err(e) => {
                writeln!(err, "error: {e}")?;
                return Ok(EXIT_BAD_INPUT);
            }
        }
    }
    // No two Kubernetes objects share a UID: such input is no cluster's.
    let mut uids = std::collections::BTreeMap::new();
    for (path, service) in &services {
        let Some(uid) = service.metadata.uid.as_deref().filter(|uid| !uid.is_empty()) else { continue };
        let key = format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or("")
        );
        if let Some((first_path, first)) = uids.insert(uid.to_ascii_lowercase(), (path, key.clone()))
            && first != key
        {
            writeln!(
                err,
                "error: {}: Service {key} has UID {uid}, which Service {first} in {} has too; no two objects share a UID",
                path.display(),
                first_path.display()
            )?;
            return Ok(EXIT_BAD_INPUT);
        }
    }
    let runtime = Runtime::new()?;
    let logic = runtime.load(&logic.bytes()?, logic.limits())?;
    let mut session = logic.session()?;
    let mut all_admitted = true;
    match session.validate_config(&config)? {
        Ok(mode) => writeln!(out, "{}: configuration accepted: {} mode", config_path.display(), mode_name(mode))?,
        Err(refusal) => {
            all_admitted = false;
            writeln!(
                out,
                "{}: configuration refused: {} ({}): {}",
                config_path.display(),
                refusal.reason,
                refusal.field,
                refusal.message
            )?;
        }
    }
    for (path, service) in &services {
        let record = records::service(service);
        let judged = session.admit_service(&config, &record)?;
        let what = match &judged.verdict {
            Verdict::Admitted => "admitted".to_owned(),
            Verdict::NothingToProvision => "admitted, nothing to provision (no ports)".to_owned(),
            Verdict::Cleanup => "being deleted: cleanup proceeds".to_owned(),
            Verdict::Ignored(why) => format!("ignored: {why}"),
            Verdict::Rejected(r) => {
                all_admitted = false;
                format!("rejected: {}: {}", r.reason, r.message)
            }
        };
        writeln!(out, "{}: service {}/{}: {what}", path.display(), record.namespace, record.name)?;
        for warning in &judged.warnings {
            writeln!(out, "{}: service {}/{}: warning: {warning}", path.display(), record.namespace, record.name)?;
        }
    }
    Ok(if all_admitted { EXIT_OK } else { EXIT_REFUSED })
}
