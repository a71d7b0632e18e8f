//! Kubernetes name rules that more than one component checks.

/// An RFC 1123 label, as Kubernetes requires of namespace names, and so of
/// ManagedCluster names (each has a namespace of its name on the hub): at
/// most 63 lower-case letters, digits and `-`, starting and ending with a
/// letter or digit. The error says what to fix.
pub fn dns_label(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("empty: a name is needed".into());
    }
    if value.len() > 63 {
        return Err(format!("{} characters, at most 63 allowed", value.len()));
    }
    let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let b = value.as_bytes();
    if b.iter().all(inner) && b.first().is_some_and(edge) && b.last().is_some_and(edge) {
        Ok(())
    } else {
        Err(
            "use lower-case letters, digits and '-', starting and ending with a letter or digit"
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::dns_label;

    #[test]
    fn dns_labels() {
        for good in ["hub", "cluster1", "a", "0", "c-0", &"x".repeat(63)] {
            assert_eq!(dns_label(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "Hub",
            "-a",
            "a-",
            "a_b",
            "a.b",
            "a/b",
            "é",
            &"x".repeat(64),
        ] {
            assert!(dns_label(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            dns_label(&"x".repeat(64)),
            Err("64 characters, at most 63 allowed".into())
        );
    }
}
