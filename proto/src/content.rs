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
}
