//! Seeded generation for property tests, shared by the crates' property
//! tests (included with `#[path]`): the same cases on every run, another
//! seed with `PROPERTY_SEED=<u64>`. Also the API server's naming rules,
//! written out independently of the code under test.
#![allow(dead_code)]

use serde_json::{Map, Value};

/// SplitMix64: small, fast, and the same everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new() -> Self {
        let seed = std::env::var("PROPERTY_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_a12c_0de5_0001);
        Self(seed)
    }

    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.u64() % n.max(1) as u64) as usize
    }

    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.u64() as u8).collect()
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Names that are mostly valid, often nearly so, sometimes anything:
    /// edges of the API server's rules (length, case, dots, dashes, `..`).
    pub fn name(&mut self, max: usize) -> String {
        const VALID: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        const ODD: &[u8] = b"-.-.A_Z/ %:\xc3";
        let edgy = self.chance(4);
        let len = match self.below(if edgy { 4 } else { 8 }) {
            0 => 0,
            1 => max + self.below(3),
            2 => max,
            _ => 1 + self.below(20),
        };
        let mut s: Vec<u8> = (0..len)
            .map(|i| {
                if edgy && self.chance(4) && i > 0 {
                    *self.pick(ODD)
                } else {
                    *self.pick(VALID)
                }
            })
            .collect();
        if self.chance(20) {
            s = self
                .pick(&[&b".."[..], b".", b"-a", b"a-", b"a..b", b"a.-b"])
                .to_vec();
        }
        if !s.is_empty() && len >= max && !edgy {
            // Long but valid: end on a letter.
            let last = s.len() - 1;
            s[last] = b'z';
        }
        String::from_utf8_lossy(&s).into_owned()
    }

    pub fn text(&mut self, max: usize) -> String {
        let n = self.below(max + 1);
        (0..n)
            .map(|_| (b' ' + self.below(95) as u8) as char)
            .collect()
    }

    pub fn json(&mut self, depth: usize) -> Value {
        match self.below(if depth == 0 { 4 } else { 6 }) {
            0 => Value::Null,
            1 => Value::Bool(self.chance(2)),
            2 => Value::from(self.u64() as i64 >> self.below(64)),
            3 => Value::from(self.text(8)),
            4 => Value::Array((0..self.below(4)).map(|_| self.json(depth - 1)).collect()),
            _ => {
                let mut m = Map::new();
                for _ in 0..self.below(5) {
                    m.insert(self.text(4), self.json(depth - 1));
                }
                Value::Object(m)
            }
        }
    }
}

/// The API server's rules for a namespace and a custom resource's name,
/// written out independently of the code under test.
pub fn k8s_label(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty() && ok(&b[0]) && ok(&b[b.len() - 1]) && b.iter().all(|c| ok(c) || *c == b'-')
}

pub fn k8s_namespace(s: &str) -> bool {
    s.len() <= 63 && k8s_label(s)
}

pub fn k8s_name(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(k8s_label)
}

/// RFC 7386.
pub fn apply_merge_patch(target: &Value, patch: &Value) -> Value {
    match patch {
        Value::Object(p) => {
            let mut out = match target {
                Value::Object(t) => t.clone(),
                _ => Map::new(),
            };
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = apply_merge_patch(out.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}
