//! An error and its causes on one line, `what failed: why: why that`, for every message that
//! reports an error from a library (a connection, an HTTP request).
//!
//! Pure text; it lives here, beside duration parsing, because the client library and the fenced
//! store's client both report transport errors and should say them alike.

use std::error::Error;

/// `error` followed by each of its causes, joined with `: `. A cause whose text is already in
/// the line is left out: transport libraries often repeat their source in their own message.
pub fn error_chain(error: &dyn Error) -> String {
    with_causes(error.to_string(), error.source())
}

/// `head` followed by `cause` and each of its own causes, as [`error_chain`] joins them: for an
/// error whose own text is not its `Display` (a status's message, say).
pub fn with_causes(head: String, cause: Option<&(dyn Error + 'static)>) -> String {
    let mut text = head;
    let mut source = cause;
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1
                .as_deref()
                .map(|cause| cause as &(dyn Error + 'static))
        }
    }

    #[test]
    fn causes_follow_the_error_and_repeated_ones_are_left_out() {
        let refused = Layer("connection refused", None);
        let error = Layer(
            "transport error",
            Some(Box::new(Layer(
                "tcp connect error: connection refused",
                Some(Box::new(refused)),
            ))),
        );
        assert_eq!(
            error_chain(&error),
            "transport error: tcp connect error: connection refused"
        );
        assert_eq!(error_chain(&Layer("alone", None)), "alone");
        assert_eq!(
            with_causes("Unavailable".to_string(), error.source()),
            "Unavailable: tcp connect error: connection refused"
        );
    }
}
