//! Objects into Lua tables and back, with Karmada's rules (JSON through `gopher-json`, then
//! its fix-up of empty tables):
//!
//! - into Lua: `null` fields are left out and `null` array elements dropped; numbers are
//!   Lua numbers (doubles);
//! - out of Lua: an empty table is `[]`; a table whose keys are 1..n is an array, one whose
//!   keys are all strings an object (keys sorted), anything else an error; a table met twice in
//!   one result is an error (shared, not only cyclic); integral numbers are integers;
//! - then empty tables: the whole result `[]` is `{}` when an object is expected; a nested
//!   `[]` becomes `{}` where a reference object had `{}` at the same path (array indices left
//!   out of paths), stays where one had `[]`, and is removed otherwise. Only Retain (desired
//!   and observed) and ReviseReplica (the original) have references, so every other
//!   operation's empty tables disappear.

use std::collections::{BTreeMap, HashSet};

use mlua::{Lua, Table, Value as LuaValue};
use serde_json::{Map, Value};

/// Why a Lua value cannot be an object.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EncodeError {
    #[error("cannot encode recursively nested tables to JSON")]
    Nested,
    #[error("cannot encode mixed or invalid key types")]
    MixedKeys,
    #[error("cannot encode sparse array")]
    Sparse,
    #[error("json: unsupported value: {0}")]
    Number(f64),
    #[error("cannot encode {0} to JSON")]
    Type(&'static str),
}

/// A value's Lua type name (mlua calls integral numbers `integer`; Lua 5.1 has numbers).
pub fn type_name(v: &LuaValue) -> &'static str {
    match v {
        LuaValue::Integer(_) => "number",
        other => other.type_name(),
    }
}

/// An object as a Lua value.
pub fn to_lua(lua: &Lua, v: &Value) -> mlua::Result<LuaValue> {
    Ok(match v {
        Value::Null => LuaValue::Nil,
        Value::Bool(b) => LuaValue::Boolean(*b),
        Value::Number(n) => LuaValue::Number(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => LuaValue::String(lua.create_string(s)?),
        Value::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in (1..).zip(items.iter().filter(|x| !x.is_null())) {
                t.raw_set(i, to_lua(lua, item)?)?;
            }
            LuaValue::Table(t)
        }
        Value::Object(m) => {
            let t = lua.create_table_with_capacity(0, m.len())?;
            for (k, item) in m.iter().filter(|(_, x)| !x.is_null()) {
                t.raw_set(k.as_str(), to_lua(lua, item)?)?;
            }
            LuaValue::Table(t)
        }
    })
}

/// A Lua value as an object (before the fix-up of empty tables).
pub fn from_lua(v: &LuaValue) -> Result<Value, EncodeError> {
    let mut seen = HashSet::new();
    encode(v, &mut seen)
}

fn number(f: f64) -> Result<Value, EncodeError> {
    if !f.is_finite() {
        return Err(EncodeError::Number(f));
    }
    // Integral values print without a fraction, as Go's encoder does.
    if f.fract() == 0.0 && f.abs() < 9.0e18 {
        return Ok(Value::from(f as i64));
    }
    Ok(serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number))
}

fn encode(v: &LuaValue, seen: &mut HashSet<usize>) -> Result<Value, EncodeError> {
    match v {
        LuaValue::Nil => Ok(Value::Null),
        LuaValue::Boolean(b) => Ok(Value::Bool(*b)),
        LuaValue::Integer(i) => Ok(Value::from(*i)),
        LuaValue::Number(f) => number(*f),
        LuaValue::String(s) => Ok(Value::String(s.to_string_lossy())),
        LuaValue::Table(t) => encode_table(t, seen),
        other => Err(EncodeError::Type(type_name(other))),
    }
}

fn encode_table(t: &Table, seen: &mut HashSet<usize>) -> Result<Value, EncodeError> {
    // Karmada's encoder keeps every table it met: one met again is refused.
    if !seen.insert(t.to_pointer() as usize) {
        return Err(EncodeError::Nested);
    }
    let mut numbered: BTreeMap<i64, LuaValue> = BTreeMap::new();
    let mut named: BTreeMap<String, LuaValue> = BTreeMap::new();
    for pair in t.pairs::<LuaValue, LuaValue>() {
        let Ok((k, v)) = pair else {
            return Err(EncodeError::MixedKeys);
        };
        match k {
            LuaValue::Integer(i) => {
                numbered.insert(i, v);
            }
            LuaValue::Number(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                numbered.insert(f as i64, v);
            }
            LuaValue::String(s) => {
                named.insert(s.to_string_lossy(), v);
            }
            _ => return Err(EncodeError::MixedKeys),
        }
    }
    if !numbered.is_empty() && !named.is_empty() {
        return Err(EncodeError::MixedKeys);
    }
    if !named.is_empty() {
        let mut m = Map::new();
        for (k, v) in named {
            m.insert(k, encode(&v, seen)?);
        }
        return Ok(Value::Object(m));
    }
    let mut out = Vec::with_capacity(numbered.len());
    for (expect, (k, v)) in (1i64..).zip(numbered) {
        if k != expect {
            return Err(EncodeError::Sparse);
        }
        out.push(encode(&v, seen)?);
    }
    Ok(Value::Array(out))
}

/// Karmada's fix-up of empty tables in a result (see the module's doc). `object`: the
/// result is read as an object (not a list).
pub fn fix_empty(result: Value, references: &[&Value], object: bool) -> Value {
    if result.as_array().is_some_and(Vec::is_empty) {
        return if object {
            Value::Object(Map::new())
        } else {
            Value::Array(Vec::new())
        };
    }
    let mut slices = HashSet::new();
    let mut structs = HashSet::new();
    for r in references {
        find_empty(r, "", &mut slices, &mut structs);
    }
    let mut result = result;
    mend(&mut result, "", &slices, &structs);
    result
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn find_empty(v: &Value, path: &str, slices: &mut HashSet<String>, structs: &mut HashSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = join(path, &k.replace('.', "\\."));
                match x {
                    Value::Array(a) if a.is_empty() => {
                        slices.insert(p);
                    }
                    Value::Object(o) if o.is_empty() => {
                        structs.insert(p);
                    }
                    _ => find_empty(x, &p, slices, structs),
                }
            }
        }
        // Array elements are transparent: paths carry no indices.
        Value::Array(a) => {
            for x in a {
                find_empty(x, path, slices, structs);
            }
        }
        _ => {}
    }
}

/// What an empty table at `path` becomes: `{}`, kept `[]`, or removed (`None`).
fn mended(path: &str, slices: &HashSet<String>, structs: &HashSet<String>) -> Option<Value> {
    if structs.contains(path) {
        Some(Value::Object(Map::new()))
    } else if slices.contains(path) {
        Some(Value::Array(Vec::new()))
    } else {
        None
    }
}

fn is_empty_array(v: &Value) -> bool {
    v.as_array().is_some_and(Vec::is_empty)
}

fn mend(v: &mut Value, path: &str, slices: &HashSet<String>, structs: &HashSet<String>) {
    match v {
        Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let p = join(path, &k.replace('.', "\\."));
                let Some(x) = m.get_mut(&k) else { continue };
                if is_empty_array(x) {
                    match mended(&p, slices, structs) {
                        Some(n) => *x = n,
                        None => {
                            m.remove(&k);
                        }
                    }
                } else {
                    mend(x, &p, slices, structs);
                }
            }
        }
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for mut x in std::mem::take(items) {
                if is_empty_array(&x) {
                    if let Some(n) = mended(path, slices, structs) {
                        out.push(n);
                    }
                } else {
                    mend(&mut x, path, slices, structs);
                    out.push(x);
                }
            }
            *items = out;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round(lua: &Lua, script: &str) -> Result<Value, EncodeError> {
        let v: LuaValue = lua.load(script).eval().unwrap();
        from_lua(&v)
    }

    #[test]
    fn objects_enter_lua_without_nulls_and_numbers_come_back_integral() {
        let lua = Lua::new();
        let obj = json!({"a": null, "b": [1, null, 3], "c": 2.5, "d": {"e": "x"}, "n": 3});
        let t = to_lua(&lua, &obj).unwrap();
        lua.globals().set("o", t).unwrap();
        let (a, len, c): (LuaValue, i64, f64) = lua.load("return o.a, #o.b, o.c").eval().unwrap();
        assert!(a.is_nil());
        assert_eq!((len, c), (2, 2.5));
        let back = from_lua(&lua.globals().get::<LuaValue>("o").unwrap()).unwrap();
        assert_eq!(
            back,
            json!({"b": [1, 3], "c": 2.5, "d": {"e": "x"}, "n": 3})
        );
        assert_eq!(round(&lua, "return 6/2").unwrap(), json!(3));
        assert_eq!(round(&lua, "return 3/2").unwrap(), json!(1.5));
    }

    #[test]
    fn tables_encode_as_gopher_json_does() {
        let lua = Lua::new();
        assert_eq!(round(&lua, "return {}").unwrap(), json!([]));
        assert_eq!(
            round(&lua, "return {z = 1, a = {1, 2}}")
                .unwrap()
                .to_string(),
            r#"{"a":[1,2],"z":1}"#
        );
        assert_eq!(
            round(&lua, "return {1, 2, x = 3}"),
            Err(EncodeError::MixedKeys)
        );
        assert_eq!(
            round(&lua, "local t = {1, 2, 3}; t[2] = nil; return t"),
            Err(EncodeError::Sparse)
        );
        assert_eq!(
            round(&lua, "return {[true] = 1}"),
            Err(EncodeError::MixedKeys)
        );
        assert_eq!(
            round(&lua, "local s = {a = 1}; return {x = s, y = s}"),
            Err(EncodeError::Nested)
        );
        assert_eq!(
            round(&lua, "local t = {}; t.self = t; return t"),
            Err(EncodeError::Nested)
        );
        assert_eq!(
            round(&lua, "return {f = function() end}"),
            Err(EncodeError::Type("function"))
        );
        assert!(matches!(
            round(&lua, "return {x = 1/0}"),
            Err(EncodeError::Number(_))
        ));
    }

    #[test]
    fn empty_tables_are_mended_from_the_references_or_removed() {
        // No references: every nested empty table goes; the whole `[]` is `{}` or `[]`.
        let r = json!({"spec": {"a": [], "b": {"c": []}, "l": [[], {"d": []}]}, "kind": "X"});
        assert_eq!(
            fix_empty(r.clone(), &[], true),
            json!({"spec": {"b": {}, "l": [{}]}, "kind": "X"})
        );
        assert_eq!(fix_empty(json!([]), &[], true), json!({}));
        assert_eq!(fix_empty(json!([]), &[], false), json!([]));
        // A reference with `{}` and `[]` at those paths (indices left out).
        let desired = json!({"status": {}, "spec": {"a": [], "l": [{"d": {}}]}});
        let fixed = fix_empty(r, &[&desired], true);
        assert_eq!(
            fixed,
            json!({"spec": {"a": [], "b": {}, "l": [{"d": {}}]}, "kind": "X"})
        );
        let retained = fix_empty(
            json!({"status": [], "kind": "X"}),
            &[&json!({}), &desired],
            true,
        );
        assert_eq!(retained, json!({"status": {}, "kind": "X"}));
    }
}
