//! Why something read from the other side does not satisfy its contract.

/// Longest part of an offending value quoted in an error (the value may be attacker-sized).
pub(crate) const QUOTE_MAX: usize = 64;

/// `value` quoted for an error message, cut to [`QUOTE_MAX`] characters.
pub(crate) fn quote(value: &str) -> String {
    if value.chars().count() <= QUOTE_MAX {
        format!("{value:?}")
    } else {
        let head: String = value.chars().take(QUOTE_MAX).collect();
        format!("{head:?}… ({} bytes)", value.len())
    }
}

/// A value that breaks its contract. Messages quote at most [`QUOTE_MAX`] characters of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    /// A required key is absent.
    #[error("contract {contract}: key {key:?} is missing")]
    MissingKey {
        contract: &'static str,
        key: &'static str,
    },
    /// A value does not have the contract's form.
    #[error("contract {contract}: {what} {value} is invalid: {why}")]
    Invalid {
        contract: &'static str,
        what: &'static str,
        value: String,
        why: String,
    },
}

impl ContractError {
    pub(crate) fn invalid(
        contract: &'static str,
        what: &'static str,
        value: &str,
        why: impl Into<String>,
    ) -> Self {
        ContractError::Invalid {
            contract,
            what,
            value: quote(value),
            why: why.into(),
        }
    }
}
