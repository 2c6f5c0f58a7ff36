//! A component as the CNCF TAG Runtime's wasm OCI artifact: an OCI image manifest whose config
//! is `application/vnd.wasm.config.v0+json` (architecture `wasm`, os `wasip2`, the layer's
//! digest, the component's imports and exports) and whose one layer is the component,
//! `application/wasm`. What the product adds is annotations: the WIT package version the
//! component exports and the state version its trackers write.
//!
//! The config's `created` is fixed (the Unix epoch, as reproducible builds write it) so that one
//! component pushed twice is one digest: a tag moved to the same bytes is no new version.

use crate::OciError;
use crate::client::{Client, OCI_MANIFEST, sha256_digest};
use crate::reference::Reference;
use serde_json::{Value, json};

pub const WASM_CONFIG: &str = "application/vnd.wasm.config.v0+json";
pub const WASM_LAYER: &str = "application/wasm";
/// The annotation naming the WIT package the component exports (`clb:reconciler@0.x.y`).
pub const ANNOTATION_PACKAGE: &str = "io.github.clb-reconciler.wit-package";
/// The annotation naming the state version the component's trackers write.
pub const ANNOTATION_STATE_VERSION: &str = "io.github.clb-reconciler.state-version";
/// A config is a few kilobytes.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// What goes into the artifact beside the component.
#[derive(Clone, Debug, Default)]
pub struct Description {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    /// `clb:reconciler@0.x.y`, when the component exports it.
    pub package: Option<String>,
    pub state_version: Option<u32>,
}

/// The config and manifest of `component` described by `description`.
pub fn build(component: &[u8], description: &Description) -> (Vec<u8>, Vec<u8>) {
    let layer = sha256_digest(component);
    let config = json!({
        "created": "1970-01-01T00:00:00Z",
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [layer],
        "component": {"imports": description.imports, "exports": description.exports},
    });
    let config = serde_json::to_vec(&config).expect("a JSON value always prints");
    let mut annotations = serde_json::Map::new();
    if let Some(package) = &description.package {
        annotations.insert(ANNOTATION_PACKAGE.into(), Value::String(package.clone()));
    }
    if let Some(version) = description.state_version {
        annotations.insert(ANNOTATION_STATE_VERSION.into(), Value::String(version.to_string()));
    }
    let mut manifest = json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": WASM_CONFIG, "digest": sha256_digest(&config), "size": config.len()},
        "layers": [{"mediaType": WASM_LAYER, "digest": layer, "size": component.len()}],
    });
    if !annotations.is_empty() {
        manifest["annotations"] = Value::Object(annotations);
    }
    (config, serde_json::to_vec(&manifest).expect("a JSON value always prints"))
}

/// Pushes `component` to `reference` (its tag, else its digest); the manifest's digest.
pub async fn push(
    client: &Client,
    reference: &Reference,
    component: &[u8],
    description: &Description,
) -> Result<String, OciError> {
    let (config, manifest) = build(component, description);
    client.push_blob(reference, component).await?;
    client.push_blob(reference, &config).await?;
    let target = reference.tag.clone().unwrap_or_else(|| sha256_digest(&manifest));
    client.push_manifest(reference, &target, OCI_MANIFEST, &manifest).await
}

/// A component pulled from a registry.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// The manifest's digest: what a signature signs and a pin names.
    pub digest: String,
    pub component: Vec<u8>,
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// Pulls the component `reference` names: its manifest must be a wasm artifact of one
/// `application/wasm` layer of at most `cap` bytes (checked before the layer is read).
pub async fn pull(client: &Client, reference: &Reference, cap: u64) -> Result<Pulled, OciError> {
    let manifest = client.manifest(reference).await?;
    let not_wasm = |why: String| OciError::NotAComponent { reference: reference.to_string(), why };
    let value: Value =
        serde_json::from_slice(&manifest.bytes).map_err(|e| not_wasm(format!("the manifest is not JSON: {e}")))?;
    let config_type = value["config"]["mediaType"].as_str().unwrap_or_default();
    if config_type != WASM_CONFIG {
        return Err(not_wasm(format!("its config is `{config_type}`, not `{WASM_CONFIG}`")));
    }
    let layers = value["layers"].as_array().map(Vec::as_slice).unwrap_or_default();
    let [layer] = layers else {
        return Err(not_wasm(format!("{} layers, not one", layers.len())));
    };
    let (Some(media_type), Some(digest), Some(size)) =
        (layer["mediaType"].as_str(), layer["digest"].as_str(), layer["size"].as_u64())
    else {
        return Err(not_wasm("its layer lacks a mediaType, digest or size".into()));
    };
    if media_type != WASM_LAYER {
        return Err(not_wasm(format!("its layer is `{media_type}`, not `{WASM_LAYER}`")));
    }
    if !crate::reference::is_sha256_digest(digest) {
        return Err(not_wasm(format!("its layer's digest `{digest}` is not sha256")));
    }
    if size > cap {
        return Err(OciError::TooLarge { url: format!("{reference} layer {digest}"), cap });
    }
    if let Some(config_digest) = value["config"]["digest"].as_str().filter(|d| crate::reference::is_sha256_digest(d)) {
        // The config is read for its size check alone: a registry serving garbage there says so.
        client.blob(reference, config_digest, MAX_CONFIG_BYTES).await?;
    }
    let component = client.blob(reference, digest, size).await?;
    let annotations = value["annotations"]
        .as_object()
        .map(|map| map.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default();
    Ok(Pulled { digest: manifest.digest, component, annotations })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_component_makes_one_manifest_of_one_wasm_layer_with_its_annotations() {
        let description = Description {
            imports: vec!["clb:reconciler/diagnostics@0.9.0".into()],
            exports: vec!["clb:reconciler/reconciler@0.9.0".into()],
            package: Some("clb:reconciler@0.9.0".into()),
            state_version: Some(10),
        };
        let (config, manifest) = build(b"\0asm component", &description);
        assert_eq!(build(b"\0asm component", &description), (config.clone(), manifest.clone()), "reproducible");
        let manifest: Value = serde_json::from_slice(&manifest).unwrap();
        assert_eq!(manifest["config"]["mediaType"], WASM_CONFIG);
        assert_eq!(manifest["config"]["digest"], sha256_digest(&config));
        assert_eq!(manifest["layers"][0]["mediaType"], WASM_LAYER);
        assert_eq!(manifest["layers"][0]["digest"], sha256_digest(b"\0asm component"));
        assert_eq!(manifest["annotations"][ANNOTATION_STATE_VERSION], "10");
        assert_eq!(manifest["annotations"][ANNOTATION_PACKAGE], "clb:reconciler@0.9.0");
        let config: Value = serde_json::from_slice(&config).unwrap();
        assert_eq!(config["layerDigests"][0], manifest["layers"][0]["digest"]);
        assert_eq!(config["os"], "wasip2");
    }
}
