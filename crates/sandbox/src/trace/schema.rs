//! The functions a component exports, by their trace names, with their WIT types; and the
//! schema file (`hosts/schema/clb-reconciler.json`) that other hosts read instead of a WIT
//! parser. Both come from the compiled component's own types.

use super::canonical::kind;
use crate::PACKAGE;
use serde_json::{Value as Json, json};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::types::Type;

/// One exported function.
#[derive(Clone, Debug)]
pub struct Signature {
    /// The trace name: the WIT name, with its resource's in front (`tracker.observe`).
    pub call: String,
    /// The exporting interface, as the component names it (`clb:reconciler/reconciler@0.14.0`).
    pub interface: String,
    /// The export's own name (`[method]tracker.observe`).
    pub export: String,
    /// The resource it belongs to, for resource functions.
    pub resource: Option<String>,
    pub params: Vec<(String, Type)>,
    pub result: Option<Type>,
}

/// Every function of [`PACKAGE`]'s interfaces that a component exports.
#[derive(Clone, Debug)]
pub struct Signatures {
    pub package: String,
    pub functions: Vec<Signature>,
}

impl Signatures {
    /// The functions `logic` exports, with their WIT types.
    pub fn of(logic: &crate::LoadedLogic) -> Self {
        let (engine, component) = (logic.engine(), logic.component());
        let ty = component.component_type();
        let mut package = String::new();
        let mut functions = Vec::new();
        for (interface, item) in ty.exports(engine) {
            let ComponentItem::ComponentInstance(instance) = item.ty else { continue };
            let Some((path, version)) = interface.split_once('@') else { continue };
            if path.split_once('/').is_none_or(|(p, _)| p != PACKAGE) {
                continue;
            }
            package = format!("{PACKAGE}@{version}");
            for (export, item) in instance.exports(engine) {
                let ComponentItem::ComponentFunc(func) = item.ty else { continue };
                let (call, resource) = trace_name(export);
                functions.push(Signature {
                    call,
                    interface: interface.to_owned(),
                    export: export.to_owned(),
                    resource,
                    params: func.params().map(|(name, ty)| (name.to_owned(), ty)).collect(),
                    result: func.results().next(),
                });
            }
        }
        Self { package, functions }
    }

    pub fn get(&self, call: &str) -> Option<&Signature> {
        self.functions.iter().find(|f| f.call == call)
    }

    /// The schema file: `docs/traces.md`, "The schema".
    pub fn schema(&self) -> Json {
        let functions: Vec<Json> = self
            .functions
            .iter()
            .map(|f| {
                let resource = f.resource.as_deref().unwrap_or("");
                json!({
                    "call": f.call,
                    "interface": f.interface,
                    "export": f.export,
                    "params": f.params.iter().map(|(name, ty)| json!({"name": name, "type": describe(ty, resource)})).collect::<Vec<_>>(),
                    "result": f.result.as_ref().map(|ty| describe(ty, resource)),
                })
            })
            .collect();
        json!({"package": self.package, "functions": functions})
    }
}

/// `[method]tracker.observe` → (`tracker.observe`, `tracker`); `validate-config` → itself.
fn trace_name(export: &str) -> (String, Option<String>) {
    for prefix in ["[method]", "[static]", "[constructor]"] {
        if let Some(rest) = export.strip_prefix(prefix) {
            let resource = rest.split('.').next().unwrap_or(rest).to_owned();
            let call = if prefix == "[constructor]" { format!("{rest}.new") } else { rest.to_owned() };
            return (call, Some(resource));
        }
    }
    (export.to_owned(), None)
}

/// A type as the schema writes it. A compiled component keeps no resource names, so a handle
/// is named after the resource of the function it appears in.
fn describe(ty: &Type, resource: &str) -> Json {
    let d = |ty: &Type| describe(ty, resource);
    match ty {
        Type::List(list) => json!({"list": d(&list.ty())}),
        Type::Option(option) => json!({"option": d(&option.ty())}),
        Type::Tuple(tuple) => json!({"tuple": tuple.types().map(|t| d(&t)).collect::<Vec<_>>()}),
        Type::Record(record) => {
            json!({"record": record.fields().map(|f| json!({"name": f.name, "type": d(&f.ty)})).collect::<Vec<_>>()})
        }
        Type::Variant(variant) => json!({"variant": variant
            .cases()
            .map(|c| json!({"name": c.name, "type": c.ty.as_ref().map(d)}))
            .collect::<Vec<_>>()}),
        Type::Enum(cases) => json!({"enum": cases.names().collect::<Vec<_>>()}),
        Type::Result(result) => {
            json!({"result": {"ok": result.ok().as_ref().map(d), "err": result.err().as_ref().map(d)}})
        }
        Type::Own(_) => json!({"own": resource}),
        Type::Borrow(_) => json!({"borrow": resource}),
        other => Json::String(kind(other).to_owned()),
    }
}
