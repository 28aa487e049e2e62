//! Dotted field paths with indexes, as the draft writes them in `fieldPatches`
//! (`spec.template.spec.containers[0].resources.limits`) and as resource interpreters name
//! fields (`.status.readyReplicas`). A key containing dots is written quoted:
//! `metadata.labels["app.kubernetes.io/name"]`.

use serde_json::{Map, Value};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// A parsed path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath(pub Vec<Segment>);

impl FieldPath {
    /// Parses `a.b[0].c` (a leading `.` is allowed); the error says what is wrong and where.
    pub fn parse(s: &str) -> Result<FieldPath, String> {
        let s = s.strip_prefix('.').unwrap_or(s);
        if s.is_empty() {
            return Err("the path is empty".into());
        }
        let b = s.as_bytes();
        let mut segs = Vec::new();
        let mut i = 0;
        let mut expect_key = true;
        while i < b.len() {
            match b[i] {
                b'[' => {
                    let end = s[i..]
                        .find(']')
                        .map(|e| i + e)
                        .ok_or_else(|| format!("unclosed '[' at offset {i}"))?;
                    let inner = &s[i + 1..end];
                    if let Some(q) = inner.strip_prefix('"').and_then(|x| x.strip_suffix('"')) {
                        if q.is_empty() {
                            return Err(format!("empty quoted key at offset {i}"));
                        }
                        segs.push(Segment::Key(q.to_string()));
                    } else {
                        let n: usize = inner.parse().map_err(|_| {
                            format!("index '{inner}' at offset {i} is not a non-negative integer")
                        })?;
                        segs.push(Segment::Index(n));
                    }
                    i = end + 1;
                    expect_key = false;
                }
                b'.' => {
                    if expect_key {
                        return Err(format!("empty field name at offset {i}"));
                    }
                    i += 1;
                    expect_key = true;
                    if i == b.len() {
                        return Err("the path ends with '.'".into());
                    }
                }
                _ => {
                    if !expect_key {
                        return Err(format!("expected '.' or '[' at offset {i}"));
                    }
                    let end = s[i..].find(['.', '[']).map(|e| i + e).unwrap_or(b.len());
                    let key = &s[i..end];
                    if key.contains(']') || key.contains('"') || key.contains(' ') {
                        return Err(format!("invalid field name '{key}'"));
                    }
                    segs.push(Segment::Key(key.to_string()));
                    i = end;
                    expect_key = false;
                }
            }
        }
        Ok(FieldPath(segs))
    }

    /// The value at the path, if every step exists.
    pub fn get<'a>(&self, v: &'a Value) -> Option<&'a Value> {
        let mut cur = v;
        for s in &self.0 {
            cur = match s {
                Segment::Key(k) => cur.as_object()?.get(k)?,
                Segment::Index(i) => cur.as_array()?.get(*i)?,
            };
        }
        Some(cur)
    }

    /// Sets the value at the path: missing objects on the way are created; a list index must
    /// exist (or be exactly one past the end, which appends).
    pub fn set(&self, root: &mut Value, value: Value) -> Result<(), String> {
        let mut cur = root;
        for (n, s) in self.0.iter().enumerate() {
            let last = n + 1 == self.0.len();
            match s {
                Segment::Key(k) => {
                    if cur.is_null() {
                        *cur = Value::Object(Map::new());
                    }
                    let m = cur
                        .as_object_mut()
                        .ok_or_else(|| format!("{} is not an object", self.prefix(n)))?;
                    if last {
                        m.insert(k.clone(), value);
                        return Ok(());
                    }
                    cur = m.entry(k.clone()).or_insert(Value::Null);
                }
                Segment::Index(i) => {
                    let a = cur
                        .as_array_mut()
                        .ok_or_else(|| format!("{} is not a list", self.prefix(n)))?;
                    if *i == a.len() {
                        a.push(Value::Null);
                    }
                    let len = a.len();
                    let slot = a.get_mut(*i).ok_or_else(|| {
                        format!(
                            "{} has {len} items; index {i} is out of range",
                            self.prefix(n)
                        )
                    })?;
                    if last {
                        *slot = value;
                        return Ok(());
                    }
                    cur = slot;
                }
            }
        }
        Ok(())
    }

    /// The path up to (not including) segment `n`, for messages.
    fn prefix(&self, n: usize) -> String {
        if n == 0 {
            return "the object".into();
        }
        FieldPath(self.0[..n].to_vec()).to_string()
    }
}

impl std::fmt::Display for FieldPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (n, s) in self.0.iter().enumerate() {
            match s {
                // Quoted unless the bare form reads it back as it is.
                Segment::Key(k) if k.contains(['.', '[', ']', '"', ' ']) => write!(f, "[\"{k}\"]")?,
                Segment::Key(k) => {
                    if n > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?
                }
                Segment::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses() {
        let ok = [
            ("a", vec![Segment::Key("a".into())]),
            (
                ".a.b",
                vec![Segment::Key("a".into()), Segment::Key("b".into())],
            ),
            (
                "spec.containers[0].image",
                vec![
                    Segment::Key("spec".into()),
                    Segment::Key("containers".into()),
                    Segment::Index(0),
                    Segment::Key("image".into()),
                ],
            ),
            (
                "metadata.labels[\"app.kubernetes.io/name\"]",
                vec![
                    Segment::Key("metadata".into()),
                    Segment::Key("labels".into()),
                    Segment::Key("app.kubernetes.io/name".into()),
                ],
            ),
            (
                "a[1][2]",
                vec![
                    Segment::Key("a".into()),
                    Segment::Index(1),
                    Segment::Index(2),
                ],
            ),
        ];
        for (s, want) in ok {
            assert_eq!(FieldPath::parse(s).unwrap().0, want, "{s}");
        }
        for bad in [
            "", ".", "a..b", "a.", "a[", "a[x]", "a[-1]", "a]b", "a[0]b", "a[\"\"]",
        ] {
            assert!(FieldPath::parse(bad).is_err(), "{bad} should fail");
        }
        let p = FieldPath::parse("metadata.labels[\"a.b\"].x[3]").unwrap();
        assert_eq!(p.to_string(), "metadata.labels[\"a.b\"].x[3]");
    }

    #[test]
    fn gets_and_sets() {
        let mut v = json!({"spec": {"containers": [{"name": "a"}]}});
        let p = FieldPath::parse("spec.containers[0].resources.limits").unwrap();
        p.set(&mut v, json!({"nvidia.com/gpu": 2})).unwrap();
        assert_eq!(
            v["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            2
        );
        assert_eq!(p.get(&v).unwrap()["nvidia.com/gpu"], 2);
        // Appending exactly at the end is allowed; beyond is not.
        FieldPath::parse("spec.containers[1]")
            .unwrap()
            .set(&mut v, json!({"name": "b"}))
            .unwrap();
        let err = FieldPath::parse("spec.containers[5].name")
            .unwrap()
            .set(&mut v, json!("x"))
            .unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        let err = FieldPath::parse("spec.containers.name")
            .unwrap()
            .set(&mut v, json!(1))
            .unwrap_err();
        assert!(err.contains("not an object"), "{err}");
        assert!(FieldPath::parse("spec.nope[0]").unwrap().get(&v).is_none());
    }
}
