//! RFC 6902 JSON Patch between the admitted object and the injected one: what the
//! admission webhook returns to the API server.
//!
//! The diff is deliberately plain: objects are compared key by key, arrays of equal length
//! element by element, and any other changed array is replaced whole. That yields more bytes
//! than a minimal patch for grown lists, but every op is correct and order-independent of
//! how the lists were built.

use serde_json::{Map, Value, json};

/// The operations that turn `from` into `to`, in order.
pub fn diff(from: &Value, to: &Value) -> Vec<Value> {
    let mut ops = Vec::new();
    diff_at(&mut String::new(), from, to, &mut ops);
    ops
}

fn diff_at(path: &mut String, from: &Value, to: &Value, ops: &mut Vec<Value>) {
    if from == to {
        return;
    }
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => diff_objects(path, a, b, ops),
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() && !path.is_empty() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                diff_at(path, x, y, ops);
                path.truncate(len);
            }
        }
        _ => ops.push(json!({"op": "replace", "path": path.clone(), "value": to})),
    }
}

fn diff_objects(
    path: &mut String,
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    ops: &mut Vec<Value>,
) {
    for (k, va) in a {
        let len = path.len();
        path.push('/');
        path.push_str(&escape(k));
        match b.get(k) {
            Some(vb) => diff_at(path, va, vb, ops),
            None => ops.push(json!({"op": "remove", "path": path.clone()})),
        }
        path.truncate(len);
    }
    for (k, vb) in b {
        if !a.contains_key(k) {
            ops.push(json!({"op": "add", "path": format!("{path}/{}", escape(k)), "value": vb}));
        }
    }
}

/// A JSON Pointer reference token for `key` (RFC 6901: `~` and `/` escaped).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Applies `ops` (as produced by [`diff`]: `add`, `remove`, `replace`) to `doc`.
/// Used to check a patch reproduces the injected object; returns `None` on an op it
/// cannot apply.
pub fn apply(doc: &Value, ops: &[Value]) -> Option<Value> {
    let mut doc = doc.clone();
    for op in ops {
        let path = op.get("path")?.as_str()?;
        let kind = op.get("op")?.as_str()?;
        if path.is_empty() {
            doc = op.get("value")?.clone();
            continue;
        }
        let (parent, last) = path.rsplit_once('/')?;
        let last = last.replace("~1", "/").replace("~0", "~");
        let target = doc.pointer_mut(parent)?;
        match (kind, target) {
            ("add" | "replace", Value::Object(m)) => {
                m.insert(last, op.get("value")?.clone());
            }
            ("remove", Value::Object(m)) => {
                m.remove(&last)?;
            }
            ("replace", Value::Array(a)) => {
                *a.get_mut(last.parse::<usize>().ok()?)? = op.get("value")?.clone();
            }
            ("remove", Value::Array(a)) => {
                let i = last.parse::<usize>().ok()?;
                if i >= a.len() {
                    return None;
                }
                a.remove(i);
            }
            ("add", Value::Array(a)) => {
                let v = op.get("value")?.clone();
                if last == "-" {
                    a.push(v);
                } else {
                    let i = last.parse::<usize>().ok()?;
                    if i > a.len() {
                        return None;
                    }
                    a.insert(i, v);
                }
            }
            _ => return None,
        }
    }
    Some(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_round_trips() {
        let a = json!({"metadata": {"annotations": {"a/b": "1"}}, "spec": {"containers": [{"name": "x"}]}});
        let b = json!({"metadata": {"annotations": {"a/b": "2", "c~d": "3"}, "labels": {"x": "y"}},
            "spec": {"containers": [{"name": "x"}, {"name": "istio-proxy"}], "volumes": []}});
        let ops = diff(&a, &b);
        assert_eq!(apply(&a, &ops), Some(b.clone()));
        assert!(
            ops.iter()
                .any(|o| o["path"] == "/metadata/annotations/a~1b")
        );
        assert!(
            ops.iter()
                .any(|o| o["path"] == "/metadata/annotations/c~0d")
        );
        assert_eq!(diff(&b, &b), Vec::<Value>::new());
        assert_eq!(apply(&b, &diff(&b, &a)), Some(a));
    }
}
