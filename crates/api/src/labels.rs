//! Label selectors: the string syntax of `?labelSelector=` (equality- and set-based, parsed as
//! `k8s.io/apimachinery/pkg/labels.Parse` does) and the structured `metav1.LabelSelector` of
//! policies, both compiled to one [`Selector`].

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::validation::{is_qualified_name, is_valid_label_value};

/// A selector operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operator {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// One requirement of a selector: `key op values`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    op: Operator,
    /// Sorted and without duplicates.
    values: Vec<String>,
}

/// Why a selector is not valid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub struct SelectorError(pub String);

impl Requirement {
    /// A validated requirement (`labels.NewRequirement`).
    pub fn new(key: &str, op: Operator, values: Vec<String>) -> Result<Self, SelectorError> {
        let errs = is_qualified_name(key);
        if !errs.is_empty() {
            return Err(SelectorError(format!(
                "key: Invalid value: \"{key}\": {}",
                errs.join("; ")
            )));
        }
        match op {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(SelectorError(
                    "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty".into(),
                ));
            }
            Operator::Equals | Operator::NotEquals if values.len() != 1 => {
                return Err(SelectorError(
                    "values: Invalid value: exact-match compatibility requires one single value"
                        .into(),
                ));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(SelectorError(
                    "values: Invalid value: values set must be empty for exists and does not exist"
                        .into(),
                ));
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    return Err(SelectorError(
                        "values: Invalid value: for 'Gt', 'Lt' operators, exactly one value is required".into(),
                    ));
                }
                if values[0].parse::<i64>().is_err() {
                    return Err(SelectorError(format!(
                        "values[0]: Invalid value: \"{}\": for 'Gt', 'Lt' operators, the value must be an integer",
                        values[0]
                    )));
                }
            }
            _ => {}
        }
        for v in &values {
            let errs = is_valid_label_value(v);
            if !errs.is_empty() {
                return Err(SelectorError(format!(
                    "values: Invalid value: \"{v}\": {}",
                    errs.join("; ")
                )));
            }
        }
        let mut values = values;
        values.sort();
        values.dedup();
        Ok(Requirement {
            key: key.to_string(),
            op,
            values,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }
    pub fn operator(&self) -> Operator {
        self.op
    }
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether a label set satisfies this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.key);
        match self.op {
            Operator::In | Operator::Equals => {
                v.is_some_and(|v| self.values.binary_search(v).is_ok())
            }
            Operator::NotIn | Operator::NotEquals => {
                v.is_none_or(|v| self.values.binary_search(v).is_err())
            }
            Operator::Exists => v.is_some(),
            Operator::DoesNotExist => v.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(have), Some(want)) = (
                    v.and_then(|v| v.parse::<i64>().ok()),
                    self.values[0].parse::<i64>().ok(),
                ) else {
                    return false;
                };
                if self.op == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = &self.key;
        let one = || self.values.first().map(String::as_str).unwrap_or("");
        match self.op {
            Operator::Exists => write!(f, "{k}"),
            Operator::DoesNotExist => write!(f, "!{k}"),
            Operator::Equals => write!(f, "{k}={}", one()),
            Operator::NotEquals => write!(f, "{k}!={}", one()),
            Operator::GreaterThan => write!(f, "{k}>{}", one()),
            Operator::LessThan => write!(f, "{k}<{}", one()),
            Operator::In => write!(f, "{k} in ({})", self.values.join(",")),
            Operator::NotIn => write!(f, "{k} notin ({})", self.values.join(",")),
        }
    }
}

/// A compiled label selector: all requirements must hold. The empty selector selects
/// everything; [`Selector::nothing`] selects nothing (a nil `metav1.LabelSelector`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl Selector {
    pub fn everything() -> Self {
        Selector::default()
    }

    pub fn nothing() -> Self {
        Selector {
            requirements: Vec::new(),
            nothing: true,
        }
    }

    pub fn from_requirements(mut requirements: Vec<Requirement>) -> Self {
        requirements.sort_by(|a, b| a.key.cmp(&b.key).then(a.op.cmp(&b.op)));
        Selector {
            requirements,
            nothing: false,
        }
    }

    /// `key=value` for every pair.
    pub fn from_map(map: &BTreeMap<String, String>) -> Result<Self, SelectorError> {
        let reqs = map
            .iter()
            .map(|(k, v)| Requirement::new(k, Operator::Equals, vec![v.clone()]))
            .collect::<Result<_, _>>()?;
        Ok(Selector::from_requirements(reqs))
    }

    pub fn is_everything(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Parses the string syntax: `a=b,c!=d,e in (f,g),!h,i,j>3`.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        Parser::new(s).parse().map(Selector::from_requirements)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Selector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Selector::parse(s)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    End,
    ClosedPar,
    Comma,
    Bang,
    DoubleEquals,
    Equals,
    Greater,
    Identifier(String),
    In,
    Less,
    NotEquals,
    NotIn,
    OpenPar,
}

impl Token {
    fn text(&self) -> String {
        match self {
            Token::End => "end of string".into(),
            Token::ClosedPar => ")".into(),
            Token::Comma => ",".into(),
            Token::Bang => "!".into(),
            Token::DoubleEquals => "==".into(),
            Token::Equals => "=".into(),
            Token::Greater => ">".into(),
            Token::Identifier(s) => s.clone(),
            Token::In => "in".into(),
            Token::Less => "<".into(),
            Token::NotEquals => "!=".into(),
            Token::NotIn => "notin".into(),
            Token::OpenPar => "(".into(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(input: &str) -> Result<Vec<Token>, SelectorError> {
    let chars: Vec<char> = input.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, ' ' | '\t' | '\r' | '\n') {
            i += 1;
            continue;
        }
        if is_special(c) {
            // The longest operator that the following special characters spell.
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            let (tok, len) = match two.as_str() {
                "==" => (Token::DoubleEquals, 2),
                "!=" => (Token::NotEquals, 2),
                _ => match c {
                    '=' => (Token::Equals, 1),
                    '!' => (Token::Bang, 1),
                    '(' => (Token::OpenPar, 1),
                    ')' => (Token::ClosedPar, 1),
                    ',' => (Token::Comma, 1),
                    '>' => (Token::Greater, 1),
                    _ => (Token::Less, 1),
                },
            };
            out.push(tok);
            i += len;
            continue;
        }
        let start = i;
        while i < chars.len()
            && !is_special(chars[i])
            && !matches!(chars[i], ' ' | '\t' | '\r' | '\n')
        {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        out.push(match word.as_str() {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Identifier(word),
        });
    }
    out.push(Token::End);
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    input: String,
}

impl Parser {
    fn new(input: &str) -> Self {
        Parser {
            tokens: Vec::new(),
            pos: 0,
            input: input.to_string(),
        }
    }

    fn peek(&self) -> &Token {
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn err(&self, msg: String) -> SelectorError {
        SelectorError(format!("{msg} (in selector {:?})", self.input))
    }

    fn parse(mut self) -> Result<Vec<Requirement>, SelectorError> {
        self.tokens = lex(&self.input)?;
        let mut reqs = Vec::new();
        if *self.peek() == Token::End {
            return Ok(reqs);
        }
        loop {
            match self.peek() {
                Token::Identifier(_) | Token::Bang => reqs.push(self.requirement()?),
                t => {
                    return Err(self.err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.text()
                    )));
                }
            }
            match self.next() {
                Token::End => return Ok(reqs),
                Token::Comma => match self.peek() {
                    Token::Identifier(_) | Token::Bang => {}
                    t => {
                        return Err(self.err(format!(
                            "found '{}', expected: identifier after ','",
                            t.text()
                        )));
                    }
                },
                t => {
                    return Err(self.err(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        t.text()
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        if *self.peek() == Token::Bang {
            self.next();
            return match self.next() {
                Token::Identifier(key) => Requirement::new(&key, Operator::DoesNotExist, vec![]),
                t => Err(self.err(format!("found '{}', expected: identifier", t.text()))),
            };
        }
        let key = match self.next() {
            Token::Identifier(k) => k,
            t => return Err(self.err(format!("found '{}', expected: identifier", t.text()))),
        };
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Requirement::new(&key, Operator::Exists, vec![]);
        }
        let op = match self.next() {
            Token::Equals | Token::DoubleEquals => Operator::Equals,
            Token::NotEquals => Operator::NotEquals,
            Token::In => Operator::In,
            Token::NotIn => Operator::NotIn,
            Token::Greater => Operator::GreaterThan,
            Token::Less => Operator::LessThan,
            t => {
                return Err(self.err(format!(
                    "found '{}', expected: {}",
                    t.text(),
                    "[!= == = > < in notin]"
                )));
            }
        };
        let values = match op {
            Operator::In | Operator::NotIn => self.set_values()?,
            _ => match self.value_token() {
                Some(v) => vec![v],
                None => match self.peek() {
                    Token::End | Token::Comma => vec![String::new()],
                    t => {
                        return Err(self.err(format!("found '{}', expected: identifier", t.text())));
                    }
                },
            },
        };
        Requirement::new(&key, op, values)
    }

    fn set_values(&mut self) -> Result<Vec<String>, SelectorError> {
        match self.next() {
            Token::OpenPar => {}
            t => return Err(self.err(format!("found '{}', expected: '('", t.text()))),
        }
        let mut values = Vec::new();
        // `in ()` and `in (,a)` treat the missing entries as empty strings, as Kubernetes does.
        if *self.peek() == Token::ClosedPar {
            self.next();
            return Ok(vec![String::new()]);
        }
        loop {
            match self.value_token() {
                Some(v) => {
                    values.push(v);
                    match self.next() {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(values),
                        t => {
                            return Err(
                                self.err(format!("found '{}', expected: ',' or ')'", t.text()))
                            );
                        }
                    }
                }
                None => match self.next() {
                    Token::Comma => values.push(String::new()),
                    Token::ClosedPar => {
                        values.push(String::new());
                        return Ok(values);
                    }
                    t => {
                        return Err(self.err(format!(
                            "found '{}', expected: ',', ')' or identifier",
                            t.text()
                        )));
                    }
                },
            }
        }
    }

    /// In value position `in` and `notin` are ordinary words. Consumes and returns the value if
    /// the next token is one.
    fn value_token(&mut self) -> Option<String> {
        let v = match self.peek() {
            Token::Identifier(v) => v.clone(),
            Token::In => "in".to_string(),
            Token::NotIn => "notin".to_string(),
            _ => return None,
        };
        self.next();
        Some(v)
    }
}

/// The structured selector of policies and workloads (`metav1.LabelSelector`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Labels that must all be present with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on labels, ANDed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// In, NotIn, Exists or DoesNotExist.
    pub operator: String,
    /// The values for In and NotIn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Compiles to a [`Selector`]; an empty structured selector selects everything.
    pub fn to_selector(&self) -> Result<Selector, SelectorError> {
        let mut reqs = Vec::new();
        for (k, v) in &self.match_labels {
            reqs.push(Requirement::new(k, Operator::Equals, vec![v.clone()])?);
        }
        for e in &self.match_expressions {
            let op = match e.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(SelectorError(format!(
                        "operator: Unsupported value: \"{other}\": supported values: \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\""
                    )));
                }
            };
            reqs.push(Requirement::new(&e.key, op, e.values.clone())?);
        }
        Ok(Selector::from_requirements(reqs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parse_and_print() {
        let cases = [
            ("", ""),
            ("a=b", "a=b"),
            ("a==b", "a=b"),
            ("a!=b", "a!=b"),
            ("a=", "a="),
            ("x=a,y=b", "x=a,y=b"),
            ("y=b,x=a", "x=a,y=b"),
            ("  a  =  b  ", "a=b"),
            ("a in (x,y)", "a in (x,y)"),
            ("a in (y, x, x)", "a in (x,y)"),
            ("a notin (x)", "a notin (x)"),
            ("a", "a"),
            ("!a", "!a"),
            ("a>1", "a>1"),
            ("a<3", "a<3"),
            (
                "app.kubernetes.io/name=web,tier in (fe,be),!canary",
                "app.kubernetes.io/name=web,!canary,tier in (be,fe)",
            ),
            ("a in (,x)", "a in (,x)"),
            ("a in ()", "a in ()"),
            ("a=in", "a=in"),
            ("a in (in,notin)", "a in (in,notin)"),
        ];
        for (input, printed) in cases {
            let s = Selector::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(s.to_string(), printed, "{input}");
        }
    }

    #[test]
    fn parse_errors() {
        for bad in [
            "a=b=c",
            "a in x",
            "a in (x",
            "in",
            "!",
            "a,",
            ",a",
            "a b",
            "a!",
            "a=(b)",
            "a>b",
            "a>",
            "a in (x y)",
            "a<-3",
            "-a=b",
            "a=-b",
            "a=b,,c=d",
            "x/y/z=1",
            "a notin",
            "!a=b",
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn matching() {
        let l = labels(&[("app", "web"), ("tier", "fe"), ("ver", "3")]);
        let cases = [
            ("", true),
            ("app=web", true),
            ("app=db", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app notin (web)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("ver>2", true),
            ("ver>3", false),
            ("ver<4", true),
            ("app>1", false),
            ("missing=", false),
            ("app=web,tier=be", false),
        ];
        for (sel, want) in cases {
            assert_eq!(Selector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        assert!(!Selector::nothing().matches(&l));
        assert!(Selector::everything().matches(&BTreeMap::new()));
    }

    #[test]
    fn structured_selector() {
        let s: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "region", "operator": "In", "values": ["eu", "us"]},
                {"key": "canary", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        let sel = s.to_selector().unwrap();
        assert!(sel.matches(&labels(&[("app", "web"), ("region", "eu")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("region", "ap")])));
        assert!(!sel.matches(&labels(&[
            ("app", "web"),
            ("region", "eu"),
            ("canary", "1")
        ])));
        assert!(
            LabelSelector::default()
                .to_selector()
                .unwrap()
                .is_everything()
        );

        let bad_op = LabelSelector {
            match_expressions: vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: "Gt".into(),
                values: vec!["1".into()],
            }],
            ..Default::default()
        };
        assert!(bad_op.to_selector().is_err());
        let empty_in = LabelSelector {
            match_expressions: vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: "In".into(),
                values: vec![],
            }],
            ..Default::default()
        };
        assert!(empty_in.to_selector().is_err());
        assert!(
            serde_json::from_value::<LabelSelector>(serde_json::json!({"matchLabel": {}})).is_err()
        );
    }
}
