//! Which transport delivers an Application: gRPC (a spoke-agent streams it)
//! or a ManifestWork (the OCM work agent applies it).
//!
//! Per cluster: a cluster whose agent is enabled for argocd-pull (its
//! ManagedClusterAddOn `argocd-pull` exists in the cluster's namespace) gets
//! gRPC, every other cluster ManifestWork. The annotation
//! `argocd-pull.io/transport: grpc | manifestwork` on an Application forces
//! one. Both sides of the hub-controller decide with this one function, so
//! exactly one of them delivers an Application at any time.

use std::collections::BTreeMap;

use argocd_pull_apis::keys;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    ManifestWork,
    Grpc,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::ManifestWork => "manifestwork",
            Transport::Grpc => "grpc",
        }
    }
}

/// Why no transport can deliver the Application.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    #[error("annotation {key}={0:?} is not a transport: use grpc or manifestwork", key = keys::TRANSPORT)]
    Invalid(String),
    #[error("annotation {key}=grpc asks for the gRPC transport, which this hub-controller does not serve: start it with --grpc-addr, or remove the annotation", key = keys::TRANSPORT)]
    GrpcDisabled,
}

/// The transport of an Application, from its annotations, whether its
/// cluster's addon is enabled, and whether this hub serves gRPC at all.
pub fn choose(
    annotations: Option<&BTreeMap<String, String>>,
    addon_enabled: bool,
    grpc_served: bool,
) -> Result<Transport, TransportError> {
    match annotations
        .and_then(|a| a.get(keys::TRANSPORT))
        .map(String::as_str)
    {
        Some("grpc") if grpc_served => Ok(Transport::Grpc),
        Some("grpc") => Err(TransportError::GrpcDisabled),
        Some("manifestwork") => Ok(Transport::ManifestWork),
        Some(other) if !other.is_empty() => Err(TransportError::Invalid(other.into())),
        _ if grpc_served && addon_enabled => Ok(Transport::Grpc),
        _ => Ok(Transport::ManifestWork),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_table() {
        use Transport::*;
        // annotation, addon enabled, gRPC served -> transport
        type Case<'a> = (Option<&'a str>, bool, bool, Result<Transport, &'a str>);
        let cases: &[Case] = &[
            (None, true, true, Ok(Grpc)),
            (None, false, true, Ok(ManifestWork)),
            (None, true, false, Ok(ManifestWork)),
            (Some(""), true, true, Ok(Grpc)),
            (Some("manifestwork"), true, true, Ok(ManifestWork)),
            (Some("grpc"), false, true, Ok(Grpc)),
            (Some("grpc"), true, false, Err("does not serve")),
            (Some("GRPC"), true, true, Err("is not a transport")),
        ];
        for (annotation, addon, served, want) in cases {
            let annotations: Option<BTreeMap<String, String>> =
                annotation.map(|v| [(keys::TRANSPORT.to_string(), v.to_string())].into());
            let got = choose(annotations.as_ref(), *addon, *served);
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, *w, "{annotation:?} {addon} {served}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{e}"),
                (got, want) => panic!("{annotation:?} {addon} {served}: {got:?} != {want:?}"),
            }
        }
    }
}
