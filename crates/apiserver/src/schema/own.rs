//! OpenAPI schemas of Orrery's own kinds, from their descriptors
//! ([`orrery_api::kinds`]): generated from the Rust types a kind's parts are read with, or
//! written out beside the kind.

use serde_json::Value;

use orrery_api::kinds::{Descriptor, OWN, Part, Root, Schema, openapi};

use super::generated::{normalized, open};

fn part(p: &Part) -> Value {
    match p {
        Part::Typed(root) => typed(*root),
        Part::Written(f) => f(),
    }
}

fn typed(root: Root) -> Value {
    normalized(root)
}

/// The component of one own kind.
pub fn schema(d: &Descriptor) -> Value {
    match &d.schema {
        Schema::Written(f) => f(d),
        Schema::Parts {
            spec,
            status,
            open: lenient,
        } => {
            let mut spec = part(spec);
            let mut status = status.as_ref().map(part);
            if *lenient {
                open(&mut spec);
                status.iter_mut().for_each(open);
            }
            openapi::kind(d, spec, status)
        }
    }
}

/// Schemas of own kinds, with the descriptor of each.
pub fn schemas() -> Vec<(&'static Descriptor, Value)> {
    OWN.iter().map(|d| (*d, schema(d))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_own_kind_has_a_schema_naming_its_kind() {
        for (d, s) in schemas() {
            assert_eq!(
                s["x-kubernetes-group-version-kind"],
                json!([{ "group": d.group, "version": d.version, "kind": d.kind }]),
                "{}",
                d.kind
            );
        }
    }
}
