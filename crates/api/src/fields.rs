//! Field selectors (`?fieldSelector=metadata.name=web,metadata.namespace!=kube-system`), parsed as
//! `k8s.io/apimachinery/pkg/fields.ParseSelector` does. Which fields a kind supports is the API
//! server's business; this module only parses and evaluates.

use std::fmt;

use crate::object::Object;

/// One term: `field=value` or `field!=value`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    pub field: String,
    pub value: String,
    pub negated: bool,
}

/// A conjunction of terms; empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    terms: Vec<Term>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldSelectorError {
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    Term { selector: String, term: String },
    #[error("invalid field selector value {value:?}: {reason}")]
    Value { value: String, reason: &'static str },
}

impl Selector {
    pub fn everything() -> Self {
        Selector::default()
    }

    pub fn terms(&self) -> &[Term] {
        &self.terms
    }

    pub fn is_everything(&self) -> bool {
        self.terms.is_empty()
    }

    /// `field=value` terms, all required.
    pub fn equals(pairs: &[(&str, &str)]) -> Self {
        let mut terms: Vec<Term> = pairs
            .iter()
            .map(|(f, v)| Term {
                field: f.to_string(),
                value: v.to_string(),
                negated: false,
            })
            .collect();
        terms.sort_by(|a, b| a.field.cmp(&b.field));
        Selector { terms }
    }

    pub fn parse(s: &str) -> Result<Self, FieldSelectorError> {
        let mut terms = Vec::new();
        for part in split_terms(s) {
            if part.is_empty() {
                continue;
            }
            let Some((lhs, op, rhs)) = split_term(&part) else {
                return Err(FieldSelectorError::Term {
                    selector: s.to_string(),
                    term: part,
                });
            };
            terms.push(Term {
                field: lhs.to_string(),
                value: unescape(rhs)?,
                negated: op == "!=",
            });
        }
        terms.sort_by(|a, b| a.field.cmp(&b.field).then(a.value.cmp(&b.value)));
        Ok(Selector { terms })
    }

    /// Whether the object's fields satisfy every term. A missing field compares as "".
    pub fn matches(&self, obj: &Object) -> bool {
        self.terms.iter().all(|t| {
            let have = obj.field_string(&t.field).unwrap_or_default();
            (have == t.value) != t.negated
        })
    }

    /// The value this selector requires for `field`, if it has an equality term for it
    /// (lets a list by `metadata.name=x` become a single get).
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && !t.negated)
            .map(|t| t.value.as_str())
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = if t.negated { "!=" } else { "=" };
            write!(f, "{}{op}{}", t.field, escape(&t.value))?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Selector {
    type Err = FieldSelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Selector::parse(s)
    }
}

/// Splits on commas that are not escaped with a backslash.
fn split_terms(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            cur.push(c);
            escaped = true;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

/// Finds the first operator, trying `!=`, `==`, `=` at each position as Kubernetes does.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for i in 0..term.len() {
        if !term.is_char_boundary(i) {
            continue;
        }
        for op in ["!=", "==", "="] {
            if term[i..].starts_with(op) {
                return Some((&term[..i], op, &term[i + op.len()..]));
            }
        }
    }
    None
}

fn unescape(v: &str) -> Result<String, FieldSelectorError> {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                _ => {
                    return Err(FieldSelectorError::Value {
                        value: v.to_string(),
                        reason: "invalid escape sequence",
                    });
                }
            },
            ',' | '=' => {
                return Err(FieldSelectorError::Value {
                    value: v.to_string(),
                    reason: "values must escape ',' and '=' with a backslash",
                });
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace(',', "\\,")
        .replace('=', "\\=")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parse_and_match() {
        let obj: Object = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "prod"},
            "spec": {"nodeName": "n1"}
        }))
        .unwrap();
        let cases = [
            ("", true),
            ("metadata.name=web-1", true),
            ("metadata.name==web-1", true),
            ("metadata.name!=web-1", false),
            ("metadata.name=web-2", false),
            ("metadata.namespace=prod,metadata.name=web-1", true),
            ("metadata.namespace=prod,metadata.name=x", false),
            ("spec.nodeName=n1", true),
            ("spec.nodeName=", false),
            ("status.phase=", true),
            ("status.phase!=Running", true),
        ];
        for (sel, want) in cases {
            let s = Selector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(&obj), want, "{sel}");
        }
    }

    #[test]
    fn escapes_and_errors() {
        let s = Selector::parse(r"a=x\,y\=z\\").unwrap();
        assert_eq!(s.terms()[0].value, r"x,y=z\");
        assert_eq!(s.to_string(), r"a=x\,y\=z\\");
        assert!(Selector::parse("metadata.name").is_err());
        assert!(Selector::parse("a=b=c").is_err());
        assert!(Selector::parse(r"a=\q").is_err());
        assert_eq!(
            Selector::parse("metadata.name=a")
                .unwrap()
                .required_value("metadata.name"),
            Some("a")
        );
        assert_eq!(
            Selector::parse("metadata.name!=a")
                .unwrap()
                .required_value("metadata.name"),
            None
        );
    }
}
