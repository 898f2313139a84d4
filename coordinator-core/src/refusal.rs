//! Why a worker's frame or join was refused: the code the worker is sent and the sentence a
//! person reads. One type from the session's checks through the round and the coordinator
//! to the error frame, so no layer has to agree on a tuple's meaning.

use std::fmt;

use protocol::ErrorCode;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Fatal refusals end the session; the others drop one gradient and carry on.
    pub fn is_fatal(&self) -> bool {
        self.code.is_fatal()
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_code_and_message_and_knows_fatality() {
        let r = Refusal::new(ErrorCode::Late, "round 3 already closed");
        assert_eq!(r.to_string(), "Late: round 3 already closed");
        assert!(!r.is_fatal());
        assert!(Refusal::new(ErrorCode::NonFinite, "x").is_fatal());
    }
}
