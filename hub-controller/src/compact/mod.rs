//! JSON kept compressed in memory (LZ4): the caches hold every Application
//! and ManifestWork of the hub, and most of each is its status, which
//! repeats the same keys and values from resource to resource. LZ4 takes a
//! few microseconds each way for a few KiB (less than parsing the JSON,
//! which every read does anyway).
//!
//! Each text is compressed on its own, and a status of 2 KiB is too short
//! to repeat much of itself: alone it kept about 40 % of its size. So both
//! ways start from [`DICTIONARY`], a skeleton of the objects compressed
//! here (the field names of a ManifestWork and of an Application's spec and
//! status, and their common values), which halves that: a typical status
//! keeps about 20 %.

use serde::de::DeserializeOwned;

/// What the compressor may refer back to before the text itself: an empty
/// ManifestWork, then an Application with every common field, from their
/// published APIs (no object of a real hub). Changing it is safe: nothing
/// compressed outlives the process.
pub const DICTIONARY: &[u8] = include_bytes!("dictionary.txt");

/// JSON text, compressed.
#[derive(Clone, PartialEq, Eq)]
pub struct CompactJson(Box<[u8]>);

impl CompactJson {
    /// From JSON text (as `str` or bytes already checked to be JSON).
    pub fn new(json: impl AsRef<[u8]>) -> Self {
        Self(
            lz4_flex::block::compress_prepend_size_with_dict(json.as_ref(), DICTIONARY)
                .into_boxed_slice(),
        )
    }

    /// The JSON text again, as bytes.
    pub fn bytes(&self) -> Vec<u8> {
        lz4_flex::block::decompress_size_prepended_with_dict(&self.0, DICTIONARY)
            .expect("compressed by `CompactJson::new`")
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

    #[test]
    fn a_short_status_shrinks_with_the_dictionary_and_comes_back_whole() {
        // One small Application's status, with names the dictionary does
        // not know.
        let status = json!({
            "health": { "status": "Healthy", "lastTransitionTime": "2026-03-04T05:06:07Z" },
            "sync": { "status": "Synced", "revision": "89abcdef0123456789abcdef0123456789abcdef",
                      "comparedTo": { "source": { "repoURL": "https://git.corp/payments.git",
                                                  "path": "deploy/prod", "targetRevision": "release-4" },
                                      "destination": { "server": "https://kubernetes.default.svc",
                                                       "namespace": "payments" } } },
            "resources": [ { "group": "apps", "version": "v1", "kind": "Deployment",
                             "namespace": "payments", "name": "api", "status": "Synced",
                             "health": { "status": "Healthy" } } ],
            "reconciledAt": "2026-03-04T05:06:09Z", "sourceType": "Kustomize",
            "controllerNamespace": "argocd"
        });
        let text = status.to_string();
        let c = CompactJson::new(&text);
        assert_eq!(c.parse::<Value>().unwrap(), status);
        let alone = lz4_flex::compress_prepend_size(text.as_bytes()).len();
        assert!(
            c.0.len() * 3 < alone * 2,
            "{} bytes with the dictionary, {alone} without, for {}",
            c.0.len(),
            text.len()
        );
    }
}
