//! A hub Application by namespace and name: how both transports name the
//! hub copy they act for.

use kube::ResourceExt;

/// A hub Application, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HubRef {
    pub namespace: String,
    pub name: String,
}

impl HubRef {
    pub fn of<K: kube::Resource>(app: &K) -> Self {
        Self {
            namespace: app.namespace().unwrap_or_default(),
            name: app.name_any(),
        }
    }
}

impl std::fmt::Display for HubRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
