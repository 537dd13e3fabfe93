//! Validated names: elections and candidates.

use std::fmt;

use crate::error::{Error, Result, quoted};

/// The longest election name or candidate id, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// The name of an election (a responsibility such as `nightly-billing`).
///
/// 1–200 bytes of `[A-Za-z0-9._/-]`, not starting with `/` or `.`, so that
/// every backend can use it as a key, a node path or a row key unescaped.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ElectionName(String);

impl ElectionName {
    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        validate_election_name(&name).map_err(|reason| Error::invalid("election name", reason))?;
        Ok(ElectionName(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn validate_election_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{} bytes long, at most {MAX_NAME_LEN} allowed",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-')))
    {
        return Err(format!(
            "{} contains {bad:?}; only A-Z a-z 0-9 . _ / - are allowed",
            quoted(name)
        ));
    }
    if name.starts_with('/') || name.starts_with('.') {
        return Err(format!("{} must not start with '/' or '.'", quoted(name)));
    }
    Ok(())
}

impl fmt::Display for ElectionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ElectionName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl std::str::FromStr for ElectionName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ElectionName::new(s)
    }
}

/// The unique name of a replica taking part in elections.
///
/// 1–200 bytes of printable text without control characters; the default is
/// `<hostname>-<pid>`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CandidateId(String);

impl CandidateId {
    /// Validates `id`.
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        if id.is_empty() {
            return Err(Error::invalid("candidate id", "must not be empty"));
        }
        if id.len() > MAX_NAME_LEN {
            return Err(Error::invalid(
                "candidate id",
                format!("{} bytes long, at most {MAX_NAME_LEN} allowed", id.len()),
            ));
        }
        if id.chars().any(char::is_control) {
            return Err(Error::invalid(
                "candidate id",
                format!("{} contains a control character", quoted(&id)),
            ));
        }
        Ok(CandidateId(id))
    }

    /// The id another election recipe's client wrote (`data`, which that
    /// client may make anything), shown as well as it can be: invalid
    /// UTF-8 and control characters replaced, cut to [`MAX_NAME_LEN`]
    /// bytes, `empty` when there is nothing.
    pub(crate) fn shown(data: &[u8], empty: &'static str) -> Self {
        let text: String = String::from_utf8_lossy(data)
            .chars()
            .map(|c| if c.is_control() { '\u{fffd}' } else { c })
            .collect();
        let mut end = text.len().min(MAX_NAME_LEN);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        match &text[..end] {
            "" => CandidateId(empty.to_owned()),
            shown => CandidateId(shown.to_owned()),
        }
    }

    /// `<hostname>-<pid>`, the default id of this process.
    pub fn default_for_process() -> Self {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        let id = format!("{host}-{}", std::process::id());
        let id: String = id
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_NAME_LEN)
            .collect();
        CandidateId(id)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CandidateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for CandidateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl std::str::FromStr for CandidateId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        CandidateId::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_typical_names() {
        for name in [
            "nightly-billing",
            "a",
            "svc/primary",
            "x.y_z-1",
            &"a".repeat(200),
        ] {
            assert!(ElectionName::new(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn rejects_bad_names_with_reason() {
        for (name, needle) in [
            ("", "empty"),
            ("/abs", "start"),
            (".hidden", "start"),
            ("a b", "' '"),
            ("ünï", "'ü'"),
            (&"a".repeat(201), "201 bytes"),
        ] {
            let err = ElectionName::new(name).expect_err(name).to_string();
            assert!(err.contains("invalid election name"), "{err}");
            assert!(err.contains(needle), "{name:?}: {err}");
        }
    }

    #[test]
    fn candidate_ids() {
        assert!(CandidateId::new("host-42").is_ok());
        assert!(CandidateId::new("").is_err());
        assert!(CandidateId::new("a\nb").is_err());
        assert!(CandidateId::new("x".repeat(201)).is_err());
        let id = CandidateId::default_for_process();
        assert!(id.as_str().ends_with(&format!("-{}", std::process::id())));
    }

    proptest! {
        #[test]
        fn validation_matches_the_rule(name in "[ -~]{0,210}") {
            let ok = !name.is_empty()
                && name.len() <= 200
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b))
                && !name.starts_with('/')
                && !name.starts_with('.');
            prop_assert_eq!(ElectionName::new(name.clone()).is_ok(), ok, "{:?}", name);
        }

        #[test]
        fn valid_names_round_trip(name in "[A-Za-z0-9_-][A-Za-z0-9._/-]{0,199}") {
            let parsed = ElectionName::new(name.clone()).expect("valid by construction");
            prop_assert_eq!(parsed.as_str(), name.as_str());
        }
    }
}
