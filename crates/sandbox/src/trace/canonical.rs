//! The canonical JSON encoding of WIT values (`docs/traces.md`, "Values"), driven by the
//! component's own types, so that it follows the WIT rather than a list written here.
//!
//! Three conversions share the one type walk:
//! * [`write_serde`]: a host value, as serde's derive sees it, to canonical text — what the
//!   recorder writes. Serde names records' fields in snake_case and cases in UpperCamelCase and
//!   writes `u64`s and bytes as numbers; the WIT type says what each is.
//! * [`to_val`]: canonical JSON to a wasmtime [`Val`] — a replayed call's arguments.
//! * [`write_val`]: a [`Val`] to canonical text — a replayed call's result.

use base64::Engine as _;
use serde_json::Value as Json;
use std::fmt::Write as _;
use wasmtime::component::{ResourceAny, Type, Val};

/// Why a value does not fit its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {why}")]
pub struct CodecError {
    /// Where in the value, as `.field`, `[index]`, `<case>` steps from its root.
    pub path: String,
    pub why: String,
}

fn fail<T>(path: &str, why: impl Into<String>) -> Result<T, CodecError> {
    Err(CodecError { path: if path.is_empty() { "value".into() } else { path.to_owned() }, why: why.into() })
}

/// Writes `s` as a JSON string with the escapes the format fixes (serde_json's own).
pub fn write_str(out: &mut String, s: &str) {
    // serde_json escapes exactly `"`, `\` and U+0000–U+001F, with the short forms where they
    // exist and lower-case `\u00xx` otherwise: the canonical rule.
    out.push_str(&serde_json::to_string(s).expect("a string always serializes"));
}

/// A case or field name as serde's derive spells it, compared with the WIT's kebab-case name.
fn same_name(rust: &str, wit: &str) -> bool {
    let mut r = rust.chars().filter(|c| *c != '_').flat_map(char::to_lowercase);
    let mut w = wit.chars().filter(|c| *c != '-').flat_map(char::to_lowercase);
    loop {
        match (r.next(), w.next()) {
            (None, None) => return true,
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// Writes a value serialized by serde's derive (`serde_json::to_value` of a bindgen type) as
/// the canonical text of `ty`.
pub fn write_serde(out: &mut String, json: &Json, ty: &Type) -> Result<(), CodecError> {
    serde_at(out, json, ty, &mut String::new())
}

fn serde_at(out: &mut String, json: &Json, ty: &Type, path: &mut String) -> Result<(), CodecError> {
    match ty {
        Type::List(list) if list.ty() == Type::U8 => {
            let Json::Array(items) = json else { return fail(path, "expected bytes") };
            let bytes = items
                .iter()
                .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                .collect::<Option<Vec<u8>>>()
                .map_or_else(|| fail(path, "expected bytes"), Ok)?;
            write_str(out, &base64::engine::general_purpose::STANDARD.encode(bytes));
        }
        Type::List(list) => {
            let Json::Array(items) = json else { return fail(path, "expected a list") };
            seq(out, items.iter().map(|item| (list.ty(), item)), path, serde_at)?;
        }
        Type::Tuple(tuple) => {
            let Json::Array(items) = json else { return fail(path, "expected a tuple") };
            if items.len() != tuple.types().len() {
                return fail(path, "wrong tuple length");
            }
            seq(out, tuple.types().zip(items), path, serde_at)?;
        }
        Type::Option(option) => match json {
            Json::Null => out.push_str("null"),
            json => serde_at(out, json, &option.ty(), path)?,
        },
        Type::Record(record) => {
            let Json::Object(fields) = json else { return fail(path, "expected a record") };
            out.push('{');
            for (i, field) in record.fields().enumerate() {
                let value = fields
                    .iter()
                    .find(|(name, _)| same_name(name.trim_end_matches('_'), field.name))
                    .map(|(_, v)| v)
                    .map_or_else(|| fail(path, format!("field {} missing", field.name)), Ok)?;
                if i > 0 {
                    out.push(',');
                }
                write_str(out, field.name);
                out.push(':');
                let len = path.len();
                write!(path, ".{}", field.name).ok();
                serde_at(out, value, &field.ty, path)?;
                path.truncate(len);
            }
            out.push('}');
        }
        Type::Variant(variant) => {
            // Serde writes a case without payload as its name, one with a payload as
            // `{"Name": payload}`.
            let (name, payload) = match json {
                Json::String(name) => (name.as_str(), None),
                Json::Object(map) if map.len() == 1 => {
                    let (name, payload) = map.iter().next().expect("one entry");
                    (name.as_str(), Some(payload))
                }
                _ => return fail(path, "expected a variant"),
            };
            let Some(case) = variant.cases().find(|case| same_name(name, case.name)) else {
                return fail(path, format!("unknown case {name}"));
            };
            out.push_str("{\"tag\":");
            write_str(out, case.name);
            if let Some(ty) = &case.ty {
                let payload = payload.map_or_else(|| fail(path, "payload missing"), Ok)?;
                out.push_str(",\"val\":");
                let len = path.len();
                write!(path, "<{}>", case.name).ok();
                serde_at(out, payload, ty, path)?;
                path.truncate(len);
            }
            out.push('}');
        }
        Type::Enum(cases) => {
            let Json::String(name) = json else { return fail(path, "expected an enum") };
            let Some(case) = cases.names().find(|case| same_name(name, case)) else {
                return fail(path, format!("unknown case {name}"));
            };
            write_str(out, case);
        }
        Type::Result(result) => {
            let Json::Object(map) = json else { return fail(path, "expected a result") };
            let (tag, side, value) = match (map.get("Ok"), map.get("Err")) {
                (Some(v), None) => ("ok", result.ok(), v),
                (None, Some(v)) => ("err", result.err(), v),
                _ => return fail(path, "expected a result"),
            };
            write!(out, "{{\"tag\":\"{tag}\"").ok();
            if let Some(ty) = side {
                out.push_str(",\"val\":");
                serde_at(out, value, &ty, path)?;
            }
            out.push('}');
        }
        // A handle the recorder already put in its trace-local number.
        Type::Own(_) | Type::Borrow(_) => match json.as_u64() {
            Some(handle) => write!(out, "{handle}").expect("writing to a String"),
            None => return fail(path, "expected a handle"),
        },
        scalar => scalar_serde(out, json, scalar, path)?,
    }
    Ok(())
}

fn seq<'a, I, F>(out: &mut String, items: I, path: &mut String, mut each: F) -> Result<(), CodecError>
where
    I: Iterator<Item = (Type, &'a Json)>,
    F: FnMut(&mut String, &'a Json, &Type, &mut String) -> Result<(), CodecError>,
{
    out.push('[');
    for (i, (ty, item)) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        let len = path.len();
        write!(path, "[{i}]").ok();
        each(out, item, &ty, path)?;
        path.truncate(len);
    }
    out.push(']');
    Ok(())
}

fn scalar_serde(out: &mut String, json: &Json, ty: &Type, path: &str) -> Result<(), CodecError> {
    match (ty, json) {
        (Type::Bool, Json::Bool(b)) => out.push_str(if *b { "true" } else { "false" }),
        (Type::String, Json::String(s)) => write_str(out, s),
        (Type::U64, Json::Number(n)) if n.is_u64() => write!(out, "\"{n}\"").expect("writing to a String"),
        (Type::S64, Json::Number(n)) if n.is_i64() => write!(out, "\"{n}\"").expect("writing to a String"),
        (Type::U8 | Type::U16 | Type::U32 | Type::S8 | Type::S16 | Type::S32, Json::Number(n)) if !n.is_f64() => {
            write!(out, "{n}").expect("writing to a String")
        }
        (other, _) => return unsupported_or_mismatch(other, path),
    }
    Ok(())
}

fn unsupported_or_mismatch<T>(ty: &Type, path: &str) -> Result<T, CodecError> {
    match ty {
        Type::Float32 | Type::Float64 | Type::Char | Type::Flags(_) | Type::Map(_) | Type::FixedLengthList(_) => {
            fail(path, format!("the trace format has no encoding for {}", kind(ty)))
        }
        Type::Future(_) | Type::Stream(_) | Type::ErrorContext => {
            fail(path, format!("the trace format has no encoding for {}", kind(ty)))
        }
        other => fail(path, format!("expected {}", kind(other))),
    }
}

/// The WIT spelling of a type's kind, for errors and the schema.
pub fn kind(ty: &Type) -> &'static str {
    match ty {
        Type::Bool => "bool",
        Type::S8 => "s8",
        Type::U8 => "u8",
        Type::S16 => "s16",
        Type::U16 => "u16",
        Type::S32 => "s32",
        Type::U32 => "u32",
        Type::S64 => "s64",
        Type::U64 => "u64",
        Type::Float32 => "f32",
        Type::Float64 => "f64",
        Type::Char => "char",
        Type::String => "string",
        Type::List(_) => "list",
        Type::Map(_) => "map",
        Type::Record(_) => "record",
        Type::Tuple(_) => "tuple",
        Type::Variant(_) => "variant",
        Type::Enum(_) => "enum",
        Type::Option(_) => "option",
        Type::Result(_) => "result",
        Type::Flags(_) => "flags",
        Type::Own(_) => "own",
        Type::Borrow(_) => "borrow",
        Type::Future(_) => "future",
        Type::Stream(_) => "stream",
        Type::ErrorContext => "error-context",
        Type::FixedLengthList(_) => "fixed-length list",
    }
}

/// Decodes canonical JSON as a value of `ty`, strictly: every record field present and no
/// other, known cases only, integers in range, `u64`/`s64` as plain decimal strings, bytes as
/// padded base64. `handle` turns a trace-local handle into the replaying host's resource.
pub fn to_val(json: &Json, ty: &Type, handle: &dyn Fn(u64) -> Option<ResourceAny>) -> Result<Val, CodecError> {
    val_at(json, ty, handle, &mut String::new())
}

fn val_at(
    json: &Json,
    ty: &Type,
    handle: &dyn Fn(u64) -> Option<ResourceAny>,
    path: &mut String,
) -> Result<Val, CodecError> {
    let nested = |json: &Json, ty: &Type, step: std::fmt::Arguments<'_>, path: &mut String| {
        let len = path.len();
        path.write_fmt(step).ok();
        let val = val_at(json, ty, handle, path);
        path.truncate(len);
        val
    };
    Ok(match ty {
        Type::List(list) if list.ty() == Type::U8 => {
            let Json::String(text) = json else { return fail(path, "expected base64 text") };
            let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(text) else {
                return fail(path, "not standard padded base64");
            };
            Val::List(bytes.into_iter().map(Val::U8).collect())
        }
        Type::List(list) => {
            let Json::Array(items) = json else { return fail(path, "expected an array") };
            let ty = list.ty();
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                out.push(nested(item, &ty, format_args!("[{i}]"), path)?);
            }
            Val::List(out)
        }
        Type::Tuple(tuple) => {
            let Json::Array(items) = json else { return fail(path, "expected an array") };
            if items.len() != tuple.types().len() {
                return fail(path, format!("expected a tuple of {}", tuple.types().len()));
            }
            let mut out = Vec::with_capacity(items.len());
            for (i, (item, ty)) in items.iter().zip(tuple.types()).enumerate() {
                out.push(nested(item, &ty, format_args!("[{i}]"), path)?);
            }
            Val::Tuple(out)
        }
        Type::Option(option) => match json {
            Json::Null => Val::Option(None),
            json => Val::Option(Some(Box::new(val_at(json, &option.ty(), handle, path)?))),
        },
        Type::Record(record) => {
            let Json::Object(map) = json else { return fail(path, "expected an object") };
            if let Some(unknown) = map.keys().find(|key| !record.fields().any(|f| f.name == key.as_str())) {
                return fail(path, format!("unknown field {unknown}"));
            }
            let mut out = Vec::with_capacity(map.len());
            for field in record.fields() {
                let Some(value) = map.get(field.name) else {
                    return fail(path, format!("field {} missing", field.name));
                };
                out.push((field.name.to_owned(), nested(value, &field.ty, format_args!(".{}", field.name), path)?));
            }
            Val::Record(out)
        }
        Type::Variant(variant) => {
            let (tag, val) = tagged(json, path)?;
            let Some(case) = variant.cases().find(|case| case.name == tag) else {
                return fail(path, format!("unknown case {tag}"));
            };
            let payload = match (&case.ty, val) {
                (Some(ty), Some(val)) => Some(Box::new(nested(val, ty, format_args!("<{tag}>"), path)?)),
                (None, None) => None,
                (Some(_), None) => return fail(path, format!("case {tag} needs a val")),
                (None, Some(_)) => return fail(path, format!("case {tag} has no val")),
            };
            Val::Variant(tag.to_owned(), payload)
        }
        Type::Enum(cases) => {
            let Json::String(name) = json else { return fail(path, "expected an enum case") };
            if !cases.names().any(|case| case == name) {
                return fail(path, format!("unknown case {name}"));
            }
            Val::Enum(name.clone())
        }
        Type::Result(result) => {
            let (tag, val) = tagged(json, path)?;
            let side = match tag {
                "ok" => result.ok(),
                "err" => result.err(),
                other => return fail(path, format!("unknown case {other}")),
            };
            let payload = match (side, val) {
                (Some(ty), Some(val)) => Some(Box::new(nested(val, &ty, format_args!("<{tag}>"), path)?)),
                (None, None) => None,
                _ => return fail(path, format!("{tag}: val does not match the type")),
            };
            Val::Result(if tag == "ok" { Ok(payload) } else { Err(payload) })
        }
        Type::Own(_) | Type::Borrow(_) => {
            let Some(number) = json.as_u64() else { return fail(path, "expected a handle number") };
            let Some(resource) = handle(number) else { return fail(path, format!("unknown handle {number}")) };
            Val::Resource(resource)
        }
        Type::Bool => Val::Bool(json.as_bool().map_or_else(|| fail(path, "expected a bool"), Ok)?),
        Type::String => Val::String(json.as_str().map_or_else(|| fail(path, "expected a string"), Ok)?.to_owned()),
        Type::U64 => Val::U64(decimal(json, path)?),
        Type::S64 => {
            let text = json.as_str().map_or_else(|| fail(path, "expected a decimal string"), Ok)?;
            let digits = text.strip_prefix('-').unwrap_or(text);
            if !plain_decimal(digits) || text == "-0" {
                return fail(path, "expected a decimal string");
            }
            Val::S64(text.parse().map_or_else(|_| fail(path, "out of range"), Ok)?)
        }
        Type::U8 => Val::U8(int(json, path)?),
        Type::U16 => Val::U16(int(json, path)?),
        Type::U32 => Val::U32(int(json, path)?),
        Type::S8 => Val::S8(int(json, path)?),
        Type::S16 => Val::S16(int(json, path)?),
        Type::S32 => Val::S32(int(json, path)?),
        other => return unsupported_or_mismatch(other, path),
    })
}

fn tagged<'a>(json: &'a Json, path: &str) -> Result<(&'a str, Option<&'a Json>), CodecError> {
    let Json::Object(map) = json else { return fail(path, "expected {\"tag\":…}") };
    if let Some(unknown) = map.keys().find(|key| *key != "tag" && *key != "val") {
        return fail(path, format!("unknown key {unknown}"));
    }
    let Some(Json::String(tag)) = map.get("tag") else { return fail(path, "expected {\"tag\":…}") };
    Ok((tag, map.get("val")))
}

fn plain_decimal(digits: &str) -> bool {
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && (digits == "0" || !digits.starts_with('0'))
}

fn decimal(json: &Json, path: &str) -> Result<u64, CodecError> {
    match json.as_str() {
        Some(text) if plain_decimal(text) => text.parse().map_or_else(|_| fail(path, "out of range"), Ok),
        _ => fail(path, "expected a decimal string"),
    }
}

fn int<T: TryFrom<i64>>(json: &Json, path: &str) -> Result<T, CodecError> {
    match json.as_i64() {
        Some(n) if !json.is_f64() => T::try_from(n).map_or_else(|_| fail(path, "out of range"), Ok),
        _ => fail(path, "expected an integer"),
    }
}

/// Writes a [`Val`] of `ty` as canonical text; `handle` gives a resource's trace-local number.
pub fn write_val(
    out: &mut String,
    val: &Val,
    ty: &Type,
    handle: &mut dyn FnMut(&ResourceAny) -> u64,
) -> Result<(), CodecError> {
    match (ty, val) {
        (Type::List(list), Val::List(items)) if list.ty() == Type::U8 => {
            let bytes = items
                .iter()
                .map(|v| if let Val::U8(b) = v { Some(*b) } else { None })
                .collect::<Option<Vec<u8>>>()
                .map_or_else(|| fail("", "expected bytes"), Ok)?;
            write_str(out, &base64::engine::general_purpose::STANDARD.encode(bytes));
        }
        (Type::List(list), Val::List(items)) => {
            let ty = list.ty();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_val(out, item, &ty, handle)?;
            }
            out.push(']');
        }
        (Type::Tuple(tuple), Val::Tuple(items)) => {
            out.push('[');
            for (i, (item, ty)) in items.iter().zip(tuple.types()).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_val(out, item, &ty, handle)?;
            }
            out.push(']');
        }
        (Type::Option(_), Val::Option(None)) => out.push_str("null"),
        (Type::Option(option), Val::Option(Some(inner))) => write_val(out, inner, &option.ty(), handle)?,
        (Type::Record(record), Val::Record(fields)) => {
            out.push('{');
            for (i, field) in record.fields().enumerate() {
                let Some((_, value)) = fields.iter().find(|(name, _)| name == field.name) else {
                    return fail(field.name, "field missing");
                };
                if i > 0 {
                    out.push(',');
                }
                write_str(out, field.name);
                out.push(':');
                write_val(out, value, &field.ty, handle)?;
            }
            out.push('}');
        }
        (Type::Variant(variant), Val::Variant(tag, payload)) => {
            let case = variant.cases().find(|c| c.name == tag).map_or_else(|| fail(tag, "unknown case"), Ok)?;
            tag_val(out, tag, case.ty.as_ref(), payload.as_deref(), handle)?;
        }
        (Type::Enum(_), Val::Enum(name)) => write_str(out, name),
        (Type::Result(result), Val::Result(Ok(payload))) => {
            tag_val(out, "ok", result.ok().as_ref(), payload.as_deref(), handle)?
        }
        (Type::Result(result), Val::Result(Err(payload))) => {
            tag_val(out, "err", result.err().as_ref(), payload.as_deref(), handle)?
        }
        (Type::Own(_) | Type::Borrow(_), Val::Resource(resource)) => {
            write!(out, "{}", handle(resource)).expect("writing to a String")
        }
        (Type::Bool, Val::Bool(b)) => out.push_str(if *b { "true" } else { "false" }),
        (Type::String, Val::String(s)) => write_str(out, s),
        (Type::U64, Val::U64(n)) => write!(out, "\"{n}\"").expect("writing to a String"),
        (Type::S64, Val::S64(n)) => write!(out, "\"{n}\"").expect("writing to a String"),
        (Type::U8, Val::U8(n)) => write!(out, "{n}").expect("writing to a String"),
        (Type::U16, Val::U16(n)) => write!(out, "{n}").expect("writing to a String"),
        (Type::U32, Val::U32(n)) => write!(out, "{n}").expect("writing to a String"),
        (Type::S8, Val::S8(n)) => write!(out, "{n}").expect("writing to a String"),
        (Type::S16, Val::S16(n)) => write!(out, "{n}").expect("writing to a String"),
        (Type::S32, Val::S32(n)) => write!(out, "{n}").expect("writing to a String"),
        (other, _) => return unsupported_or_mismatch(other, ""),
    }
    Ok(())
}

fn tag_val(
    out: &mut String,
    tag: &str,
    ty: Option<&Type>,
    payload: Option<&Val>,
    handle: &mut dyn FnMut(&ResourceAny) -> u64,
) -> Result<(), CodecError> {
    out.push_str("{\"tag\":");
    write_str(out, tag);
    match (ty, payload) {
        (Some(ty), Some(payload)) => {
            out.push_str(",\"val\":");
            write_val(out, payload, ty, handle)?;
        }
        (None, None) => {}
        _ => return fail(tag, "payload does not match the type"),
    }
    out.push('}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Upstream TestJSONRoundTrip.
    #[test]
    fn serde_names_match_wit_names_whatever_the_case_convention() {
        assert!(same_name("backend_pool_type", "backend-pool-type"));
        assert!(same_name("ServiceUpserted", "service-upserted"));
        assert!(same_name("Ipv4", "ipv4"));
        assert!(!same_name("ServiceUpserted", "service-deleted"));
    }

    #[test]
    fn strings_are_escaped_as_the_format_says() {
        let mut out = String::new();
        write_str(&mut out, "a\"b\\c\n\u{1}/é\u{7f}\u{2028}");
        assert_eq!(out, "\"a\\\"b\\\\c\\n\\u0001/é\u{7f}\u{2028}\"");
    }

    #[test]
    fn u64_text_must_be_plain_decimal() {
        for bad in ["", "01", "+1", "-1", "1.0", "18446744073709551616", " 1"] {
            assert!(decimal(&Json::String(bad.into()), "x").is_err(), "{bad:?} accepted");
        }
        assert_eq!(decimal(&Json::String("18446744073709551615".into()), "x"), Ok(u64::MAX));
        assert_eq!(decimal(&Json::String("0".into()), "x"), Ok(0));
    }
}
