//! The manifests of `examples/deploy/` as an operator applies them: the kustomize base built by
//! the real `kustomize` (sigs.k8s.io's, pinned, built from the Go module proxy by
//! `harness/kustomize/build.sh`), then applied to the test API server by server-side apply — as a
//! dry run, and for real (in a namespace of the test's own, through an overlay) where the objects
//! need no nodes — and the Deployment's command line parsed by `clb-host` itself.

use clb_tests::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn examples_deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy").canonicalize().unwrap()
}

fn kustomize_binary() -> PathBuf {
    harness_tool("kustomize/build.sh")
}

/// `kustomize build DIR`: the objects as YAML documents.
fn kustomize_build(dir: &Path) -> String {
    let output = Command::new(kustomize_binary()).arg("build").arg(dir).output().expect("kustomize");
    assert!(output.status.success(), "kustomize build {}: {}", dir.display(), String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

fn documents(origin: &str, text: &str) -> Vec<Value> {
    clb_executor::inputs::from_yaml_documents(Path::new(origin), text).unwrap_or_else(|e| panic!("{origin}: {e}"))
}

#[test]
fn the_kustomization_of_examples_deploy_names_every_manifest_beside_it_and_no_other() {
    let dir = examples_deploy();
    let mut manifests: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
        .collect();
    manifests.sort();
    let kustomization =
        documents("kustomization.yaml", &std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap());
    let mut resources: Vec<String> =
        kustomization[0]["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_owned()).collect();
    resources.sort();
    assert_eq!(resources, manifests);
}

/// A server-side dry run judges every object (decoded, defaulted, validated, admitted, nothing
/// stored) except cert-manager's two (the webhook's certificate): the test API server has no
/// cert-manager CRDs and the project does not vendor them. Then the same base through an overlay
/// that moves it into a namespace of this test's own and prefixes every name (the cluster-wide
/// RBAC objects too, so that the other tests' grants are untouched) is applied for real and read
/// back; the webhook configuration is left out of the real apply, as it would send every
/// Service create in the shared API server to a webhook that has no pods.
#[test]
fn examples_deploy_built_by_kustomize_is_accepted_by_a_real_api_server() {
    use ::kube::api::{Api, DeleteParams, ListParams};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let admin = clb_tests::apiserver::apiserver().admin().await;
        let base = kustomize_build(&examples_deploy());
        let unserved =
            clb_tests::apiserver::apply_documents(&admin, "kustomize build examples/deploy", &base, true).await;
        assert_eq!(unserved, ["cert-manager.io/v1 Certificate", "cert-manager.io/v1 Issuer"], "the kinds not judged");
        let images: Vec<&str> = base.lines().filter_map(|l| l.trim().strip_prefix("image: ")).collect();
        assert_eq!(images, ["registry.example.com/clb-reconciler:0.1.0"; 2], "both Deployments take the base's image");

        // For real, in a namespace of its own.
        let namespace = format!("clb-manifests-{}", std::process::id());
        let prefix = format!("t{}-", std::process::id());
        let overlay = scratch("manifests-overlay");
        let base_dir = examples_deploy();
        let up = overlay.components().count() - 1;
        let relative = format!("{}{}", "../".repeat(up), base_dir.strip_prefix("/").unwrap().display());
        std::fs::write(
            overlay.join("kustomization.yaml"),
            format!("resources:\n- {relative}\nnamespace: {namespace}\nnamePrefix: {prefix}\n"),
        )
        .unwrap();
        let built = kustomize_build(&overlay);
        let stored: Vec<String> = documents("the overlay", &built)
            .into_iter()
            .filter(|d| d["kind"] != "ValidatingWebhookConfiguration")
            .map(|d| serde_json::to_string(&d).unwrap())
            .collect();
        let namespaces = Api::<Namespace>::all(admin.clone());
        let object: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}})).unwrap();
        namespaces.create(&Default::default(), &object).await.unwrap();
        let unserved =
            clb_tests::apiserver::apply_documents(&admin, "the overlay", &stored.join("\n---\n"), false).await;
        assert_eq!(unserved, ["cert-manager.io/v1 Certificate", "cert-manager.io/v1 Issuer"]);

        let deployment = Api::<Deployment>::namespaced(admin.clone(), &namespace)
            .get(&format!("{prefix}clb-reconciler"))
            .await
            .expect("the controller's Deployment stored");
        let args = deployment.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
        assert!(args.iter().any(|a| a.starts_with("--logic-oci=")), "{args:?}");
        let budgets = Api::<PodDisruptionBudget>::namespaced(admin.clone(), &namespace);
        let budgets = budgets.list(&ListParams::default()).await.unwrap().items;
        assert_eq!(budgets.len(), 2, "one budget each for the controller and the webhook");
        let policies = Api::<NetworkPolicy>::namespaced(admin.clone(), &namespace);
        let policies = policies.list(&ListParams::default()).await.unwrap().items;
        assert_eq!(policies.len(), 2, "one policy each for the controller and the webhook");

        namespaces.delete(&namespace, &DeleteParams::default()).await.unwrap();
        let name = format!("{prefix}clb-reconciler");
        Api::<ClusterRoleBinding>::all(admin.clone()).delete(&name, &DeleteParams::default()).await.unwrap();
        Api::<ClusterRole>::all(admin.clone()).delete(&name, &DeleteParams::default()).await.unwrap();
    });
}

/// The Deployment of `examples/deploy/deployment.yaml` starts `clb-host run` with flags it takes,
/// follows its logic as an OCI reference, and finds the key it verifies with where the ConfigMap
/// it mounts puts it, a key `clb-host` reads.
#[test]
fn the_example_deployment_runs_clb_host_run_with_flags_it_takes_and_the_logic_from_a_registry_checked_by_a_mounted_key()
{
    let path = examples_deploy().join("deployment.yaml");
    let documents = documents("deployment.yaml", &std::fs::read_to_string(&path).unwrap());
    let of = |kind: &str, name: &str| {
        documents
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    let pod = &of("Deployment", "clb-reconciler")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let mut args: Vec<String> = vec!["clb-host".into()];
    args.extend(container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()));
    assert_eq!(args[1], "run");
    // Every flag parses (an unknown one, or a bad value, is an error before `--help` is read).
    let mut parsed = args.clone();
    parsed.push("--help".into());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = clb_host::cli::run(parsed, &mut out, &mut err);
    assert_eq!(code, clb_host::cli::EXIT_OK, "{args:?}: {}", String::from_utf8_lossy(&err));

    let flag = |name: &str| args.iter().find_map(|a| a.strip_prefix(&format!("--{name}="))).unwrap();
    clb_oci::Reference::parse(flag("logic-oci")).expect("an OCI reference");
    let key_path = Path::new(flag("logic-verify-key"));
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| key_path.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("the key's folder is mounted");
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]).unwrap();
    let configmap = of("ConfigMap", volume["configMap"]["name"].as_str().unwrap());
    let file = key_path.file_name().unwrap().to_str().unwrap();
    let pem = configmap["data"][file].as_str().expect("the ConfigMap holds the key under the file's name");
    clb_oci::signature::PublicKey::from_pem(file, pem.as_bytes()).expect("a public key clb-host reads");
}
