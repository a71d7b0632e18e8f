//! JSON kept compressed in memory (LZ4): the caches hold every Application
//! and ManifestWork of the hub, and most of each is its status, which
//! repeats the same keys and values from resource to resource. LZ4 takes a
//! few microseconds each way for a few KiB (less than parsing the JSON,
//! which every read does anyway) and keeps the fleet benchmark's statuses
//! at about a third of their text.

use serde::de::DeserializeOwned;

/// JSON text, compressed.
#[derive(Clone, PartialEq, Eq)]
pub struct CompactJson(Box<[u8]>);

impl CompactJson {
    /// From JSON text (as `str` or bytes already checked to be JSON).
    pub fn new(json: impl AsRef<[u8]>) -> Self {
        Self(lz4_flex::compress_prepend_size(json.as_ref()).into_boxed_slice())
    }

    /// The JSON text again, as bytes.
    pub fn bytes(&self) -> Vec<u8> {
        lz4_flex::decompress_size_prepended(&self.0).expect("compressed by `CompactJson::new`")
    }

    /// The JSON, parsed as a `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.bytes())
    }
}

impl std::fmt::Debug for CompactJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompactJson({} bytes compressed)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn comes_back_whole_and_smaller() {
        let resource = |kind: &str| {
            json!({ "group": "apps", "version": "v1", "kind": kind, "namespace": "team",
                    "name": "guestbook", "status": "Synced", "health": { "status": "Healthy" } })
        };
        let status = json!({
            "sync": { "status": "Synced", "revision": "0123456789abcdef0123456789abcdef01234567" },
            "health": { "status": "Healthy" },
            "resources": (0..20).map(|i| resource(&format!("Kind{i}"))).collect::<Vec<_>>(),
            "unicode": "é ✓",
        });
        let text = status.to_string();
        let c = CompactJson::new(&text);
        assert_eq!(c.bytes(), text.as_bytes());
        assert_eq!(c.parse::<Value>().unwrap(), status);
        assert!(
            c.0.len() * 3 < text.len(),
            "{} bytes kept for {}",
            c.0.len(),
            text.len()
        );
        assert_eq!(CompactJson::new("{}").parse::<Value>().unwrap(), json!({}));
    }
}
