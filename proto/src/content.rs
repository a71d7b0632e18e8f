//! Content versions of JSON payloads.
//!
//! `ObjectMeta.version` is opaque to the receiver, but both ends need the
//! same rule for their own payloads: it changes exactly when the content
//! changes, whatever order a JSON library happens to keep object keys in.
//! So the hash is taken over a canonical form (object keys sorted, no
//! whitespace), and two values that are equal as JSON hash the same.

use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Hex characters of a content hash: 64 bits, plenty to tell the versions
/// of one object apart, short enough for an annotation and a digest entry.
pub const HASH_HEX_LEN: usize = 16;

/// The canonical bytes of a JSON value: keys sorted at every level.
pub fn canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend(serde_json::to_vec(k).expect("a string serializes"));
                out.push(b':');
                write(&map[k], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(v, out);
            }
            out.push(b']');
        }
        scalar => out.extend(serde_json::to_vec(scalar).expect("a scalar serializes")),
    }
}

/// A short hex hash of the canonical form of `value`.
pub fn hash(value: &Value) -> String {
    hash_bytes(&canonical(value))
}

/// A short hex hash of some bytes.
pub fn hash_bytes(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest
        .iter()
        .take(HASH_HEX_LEN / 2)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The JSON merge patch (RFC 7386) that turns `from` into `to`, or `None`
/// when they are equal. Used to take back fields someone else added to an
/// object whose content one side owns, which server-side apply leaves alone.
pub fn merge_diff(from: &Value, to: &Value) -> Option<Value> {
    if from == to {
        return None;
    }
    match (from, to) {
        (Value::Object(f), Value::Object(t)) => {
            let mut patch = serde_json::Map::new();
            for (k, tv) in t {
                match f.get(k) {
                    Some(fv) => {
                        if let Some(d) = merge_diff(fv, tv) {
                            patch.insert(k.clone(), d);
                        }
                    }
                    None => {
                        patch.insert(k.clone(), tv.clone());
                    }
                }
            }
            for k in f.keys().filter(|k| !t.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            Some(Value::Object(patch))
        }
        _ => Some(to.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_form_sorts_keys_at_every_level() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":[{"d":1,"c":2}],"x":null}}"#).unwrap();
        assert_eq!(
            String::from_utf8(canonical(&a)).unwrap(),
            r#"{"a":{"x":null,"y":[{"c":2,"d":1}]},"b":1}"#
        );
    }

    #[test]
    fn equal_json_hashes_the_same_and_any_change_differs() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":"x"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{ "a" : "x", "b" : 1 }"#).unwrap();
        assert_eq!(hash(&a), hash(&b));
        assert_eq!(hash(&a).len(), HASH_HEX_LEN);
        for other in [
            json!({ "a": "x", "b": 2 }),
            json!({ "a": "x" }),
            json!({ "a": "x", "b": 1, "c": null }),
            json!({ "a": ["x"], "b": 1 }),
            json!({ "a": "x\"", "b": 1 }),
        ] {
            assert_ne!(hash(&a), hash(&other), "{other}");
        }
        // Array order is content.
        assert_ne!(hash(&json!([1, 2])), hash(&json!([2, 1])));
    }

    /// RFC 7386 applied by hand, to check the diff against.
    fn apply(target: &Value, patch: &Value) -> Value {
        match (target, patch) {
            (Value::Object(t), Value::Object(p)) => {
                let mut out = t.clone();
                for (k, v) in p {
                    if v.is_null() {
                        out.remove(k);
                    } else {
                        let cur = out.get(k).cloned().unwrap_or(Value::Null);
                        out.insert(k.clone(), apply(&cur, v));
                    }
                }
                Value::Object(out)
            }
            (_, Value::Object(p)) => apply(&json!({}), &Value::Object(p.clone())),
            (_, p) => p.clone(),
        }
    }

    #[test]
    fn merge_diff_turns_one_value_into_the_other() {
        let cases = [
            (json!({ "a": 1 }), json!({ "a": 1 }), None),
            (
                json!({ "a": 1, "extra": { "x": 1 } }),
                json!({ "a": 1 }),
                Some(json!({ "extra": null })),
            ),
            (
                json!({ "s": { "rev": "a", "path": "p" } }),
                json!({ "s": { "rev": "b", "path": "p" } }),
                Some(json!({ "s": { "rev": "b" } })),
            ),
            (
                json!({ "l": [1, 2] }),
                json!({ "l": [2] }),
                Some(json!({ "l": [2] })),
            ),
            (
                json!({}),
                json!({ "n": { "m": 1 } }),
                Some(json!({ "n": { "m": 1 } })),
            ),
            (
                json!({ "a": "x" }),
                json!({ "a": { "b": 1 } }),
                Some(json!({ "a": { "b": 1 } })),
            ),
        ];
        for (from, to, want) in cases {
            let got = merge_diff(&from, &to);
            assert_eq!(got, want, "{from} -> {to}");
            if let Some(p) = got {
                assert_eq!(apply(&from, &p), to, "{from} + {p}");
            }
        }
    }
}
