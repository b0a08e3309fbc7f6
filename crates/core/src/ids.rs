//! The numbers of the lock table that must never be mixed up, each a type of its own:
//! [`SessionId`], [`Token`] and [`RequestId`].
//!
//! Each wraps a `u64` and is stored as that bare number (serde `transparent`), so the Raft log,
//! the snapshots, the fence's stored state and every other stored form are the same as when
//! they were plain integers; the wire (the proto's `u64` fields) and the sequencer text convert
//! with [`SessionId::new`] and [`SessionId::get`] (and alike) where they are read and written.
//! `Display` prints the bare number, as the messages always did.
//!
//! A session id where a token is expected does not compile:
//!
//! ```compile_fail
//! use palisade_core::{HeldBy, SessionId, Token};
//! let (session, token) = (SessionId::new(7), Token::new(42));
//! let holder = HeldBy::with_token(token, session);
//! ```
//!
//! nor does a bare number:
//!
//! ```compile_fail
//! use palisade_core::{HeldBy, Token};
//! let holder = HeldBy::with_token(7, Token::new(42));
//! ```
//!
//! nor a request id where a session id is expected:
//!
//! ```compile_fail
//! use palisade_core::{LockTable, RequestId};
//! let status = LockTable::default().session_status(RequestId::new(7));
//! ```
//!
//! ```
//! use palisade_core::{HeldBy, SessionId, Token};
//! let holder = HeldBy::with_token(SessionId::new(7), Token::new(42));
//! assert_eq!(holder.to_string(), "held by session 7 with token 42");
//! ```

use std::fmt;
use std::num::ParseIntError;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A `u64` with a meaning of its own: constructors, and `Display` and `FromStr` as the bare
/// number.
macro_rules! number {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(u64);

        impl $name {
            /// The value whose number is `value` (as the wire or a stored form spells it).
            pub const fn new(value: u64) -> $name {
                $name(value)
            }

            /// The number, for the wire and stored forms that spell it as an integer.
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        /// The bare decimal number, as `Display` prints it (and as command lines take it).
        impl FromStr for $name {
            type Err = ParseIntError;

            fn from_str(text: &str) -> Result<$name, ParseIntError> {
                text.parse().map($name)
            }
        }
    };
}

number! {
    /// A session's id. Assigned by the table from a counter; never reused.
    SessionId
}

number! {
    /// A fencing token. Strictly increasing across every grant of a lock; never reused.
    ///
    /// Every token granted is in `Token::FIRST..=`[`TOKEN_MAX`](crate::limits::TOKEN_MAX);
    /// [`Token::ZERO`] stands for "none yet".
    Token
}

number! {
    /// A client-chosen id that makes a retried command return its first outcome.
    RequestId
}

impl SessionId {
    /// The id after this one: the table assigns ids from a counter.
    ///
    /// # Panics
    /// At `u64::MAX`, which a table never reaches (one new session a nanosecond would take
    /// five centuries).
    pub fn next(self) -> SessionId {
        SessionId(self.0.checked_add(1).expect("session ids are used up"))
    }
}

impl Token {
    /// Below every token granted: the table's counter before its first grant, and "no token"
    /// where a field cannot be absent (a lock never granted, the wire's 0).
    pub const ZERO: Token = Token(0);

    /// The first token the table grants.
    pub const FIRST: Token = Token(1);

    /// `value` as a token a grant may carry: `None` outside
    /// `1..=`[`TOKEN_MAX`](crate::limits::TOKEN_MAX). A token from outside the table (a parsed
    /// sequencer) or about to leave the server (a grant signed) is built with this.
    pub const fn checked(value: u64) -> Option<Token> {
        if value >= Token::FIRST.0 && value <= crate::limits::TOKEN_MAX.0 {
            Some(Token(value))
        } else {
            None
        }
    }

    /// The token after this one: every grant takes the successor of the last token granted.
    ///
    /// # Panics
    /// At `u64::MAX`; the table stops granting at its `token_max`, far below.
    pub fn next(self) -> Token {
        Token(
            self.0
                .checked_add(1)
                .expect("a token below the token limit has a successor"),
        )
    }
}
