//! Labels or annotations as the caches keep them: every key and value in
//! one string, in key order.
//!
//! A `BTreeMap<String, String>` allocates a node of about 540 bytes for its
//! first entry and a string per key and value: the labels and annotations of
//! a cached Application took about 1.3 KiB in a heap profile of the fleet
//! benchmark, for four short pairs. Packed, they take what their text does
//! plus a few bytes per pair.

use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pairs {
    /// Every key and value, one after the other, keys in order.
    text: Box<str>,
    /// Where each key, then its value, ends in `text`.
    ends: Box<[u32]>,
}

impl Pairs {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The pairs, keys in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut start = 0;
        self.ends.chunks_exact(2).map(move |e| {
            let (k, v) = (e[0] as usize, e[1] as usize);
            let pair = (&self.text[start..k], &self.text[k..v]);
            start = v;
            pair
        })
    }

    /// Back to the map an object's metadata holds; `None` when empty (the
    /// API server omits empty maps, so the two are the same object).
    pub fn to_map(&self) -> Option<BTreeMap<String, String>> {
        (!self.is_empty()).then(|| {
            self.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
    }
}

impl From<BTreeMap<String, String>> for Pairs {
    fn from(map: BTreeMap<String, String>) -> Self {
        let mut text = String::with_capacity(map.iter().map(|(k, v)| k.len() + v.len()).sum());
        let mut ends = Vec::with_capacity(map.len() * 2);
        for (k, v) in &map {
            text.push_str(k);
            ends.push(offset(&text));
            text.push_str(v);
            ends.push(offset(&text));
        }
        Self {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        }
    }
}

fn offset(text: &str) -> u32 {
    // Kubernetes limits all of an object's annotations to 256 KiB.
    u32::try_from(text.len()).expect("labels and annotations are far below 4 GiB")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn pairs_come_back_in_key_order_with_empty_keys_and_values_kept_apart() {
        let m = map(&[("b", ""), ("a", "1"), ("example.com/c", "xy"), ("", "root")]);
        let p = Pairs::from(m.clone());
        assert_eq!(p.to_map(), Some(m));
        assert_eq!(
            p.iter().collect::<Vec<_>>(),
            [("", "root"), ("a", "1"), ("b", ""), ("example.com/c", "xy")]
        );
        assert_eq!(p.get("b"), Some(""));
        assert_eq!(p.get("a"), Some("1"));
        assert_eq!(p.get("ab"), None);
        assert_eq!(p.get(""), Some("root"));
        assert_eq!(p.get("example.com"), None);
    }

    #[test]
    fn an_empty_map_is_no_map() {
        let p = Pairs::from(BTreeMap::new());
        assert!(p.is_empty());
        assert_eq!(p.to_map(), None);
        assert_eq!(p.get(""), None);
        assert_eq!(p, Pairs::default());
    }
}
