//! Every limit of the lock table, in one place.
//!
//! Each input the service accepts is bounded by one of these constants; the [`Limits`] value a
//! server runs with may tighten them (tests do, to reach the edges quickly) but never loosen them
//! past the `*_MAX` ceilings here. Names end in their unit or `_max`, as in `lease_ttl_ms_max`.
//! How they relate is checked at compile time (`const` assertions), and [`recovery_floors`]
//! places both counters after a restore or a lost log (invariant 13).

use serde::{Deserialize, Serialize};

use crate::{DurationMs, SessionId, Token};

/// Longest lock name, in bytes of UTF-8.
pub const LOCK_NAME_BYTES_MAX: usize = 256;

/// Longest value a holder may attach to its grant ([`crate::GrantValue`]), in bytes of UTF-8:
/// room for an address, a URL or a small JSON object. Every held lock and every waiter may
/// carry one, so the bound is what keeps a table at its `locks_max` within memory.
pub const GRANT_VALUE_BYTES_MAX: usize = 1024;

/// Longest identity name (an [`crate::Identity`]), in bytes.
pub const IDENTITY_BYTES_MAX: usize = 64;

/// Checks an identity name: 1 to [`IDENTITY_BYTES_MAX`] bytes of ASCII letters, digits and `.`,
/// `_`, `-`, `@`, `:`. No white space (policy and token files separate fields with it) and no
/// `*` (a policy's wildcard).
pub fn validate_identity(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > IDENTITY_BYTES_MAX {
        return Err(format!(
            "an identity is 1 to {IDENTITY_BYTES_MAX} bytes, not {}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | ':')))
    {
        return Err(format!(
            "{c:?} in identity {:?}: an identity is made of ASCII letters, digits and . _ - @ :",
            name.escape_debug().to_string()
        ));
    }
    Ok(())
}

/// Largest fencing token the service will ever grant.
///
/// `i64::MAX`, so that every resource backend (PostgreSQL `bigint`, SQLite `INTEGER`, Redis
/// integers) stores a token natively and signed comparisons never wrap. At this value the service
/// refuses to grant the lock rather than reuse or wrap a token (invariant 1).
pub const TOKEN_MAX: Token = Token::new(i64::MAX as u64);

/// Shortest session lease a client may ask for.
pub const SESSION_TTL_MS_MIN: DurationMs = DurationMs::from_millis(1_000);
/// Longest session lease a client may ask for (one day).
pub const SESSION_TTL_MS_MAX: DurationMs = DurationMs::from_millis(86_400_000);

/// Longest time an acquire may wait in a queue (one day).
pub const WAIT_MS_MAX: DurationMs = DurationMs::from_millis(86_400_000);

/// Ceiling on concurrently open sessions.
pub const SESSIONS_MAX: usize = 50_000;
/// Ceiling on locks that exist at once (held, waited on, or in lock-delay; free locks are
/// forgotten, the shared token counter keeps their tokens safe).
pub const LOCKS_MAX: usize = 1_000_000;
/// Ceiling on waiters queued behind one lock.
pub const WAITERS_PER_LOCK_MAX: usize = 10_000;
/// How many freed-and-forgotten locks keep their last token for status reads.
pub const FORGOTTEN_LOCKS_REMEMBERED_MAX: usize = 100_000;
/// Longest lock-delay after a holder's session expires.
pub const LOCK_DELAY_MS_MAX: DurationMs = DurationMs::from_millis(60_000);
/// How many completed request ids each session remembers for retries.
pub const REQUEST_IDS_PER_SESSION_MAX: usize = 16;
/// Shortest open key, in bytes. 128 random bits: two clients never draw the same key by
/// accident, and nobody can guess a live one to be handed its session.
pub const OPEN_KEY_BYTES_MIN: usize = 16;
/// Longest open key, in bytes (room for a 256-bit random value or hash).
pub const OPEN_KEY_BYTES_MAX: usize = 32;

/// A cluster restored from a backup grants tokens above this many per second since 1970 at the
/// moment of the restore ([`restore_token_floor`]). No cluster grants 2^21 (about two million)
/// tokens a second, so every token any earlier incarnation granted before the restore is below
/// the floor, however old the backup. And the floor stays below 2^53 until 2106, so tokens stay
/// exact in a JSON number or a Lua double.
pub const RESTORE_TOKENS_PER_SECOND: u64 = 1 << 21;

/// The lowest token a cluster restored at `unix_seconds` may grant next (see
/// [`RESTORE_TOKENS_PER_SECOND`]).
pub const fn restore_token_floor(unix_seconds: u64) -> Token {
    Token::new(unix_seconds.saturating_mul(RESTORE_TOKENS_PER_SECOND))
}

// Seconds since 1970 fit 32 bits until 2106; their floor is then exact in a double.
const _: () = assert!(restore_token_floor(u32::MAX as u64).get() < 1 << 53);

/// Largest session id a floor may set the session counter to: the largest token, so a session
/// id, like a token, fits every backend's signed 64-bit integer.
pub const SESSION_ID_MAX: SessionId = SessionId::new(TOKEN_MAX.get());

/// How far a recovery floor lies above what a counter can have reached since it was known: one
/// second's worth of [`RESTORE_TOKENS_PER_SECOND`], for the clock's imprecision and for what
/// the counter did between being read and being recorded.
pub const RECOVERY_MARGIN: u64 = RESTORE_TOKENS_PER_SECOND;

/// The floors a counter recovery places the token and session counters at (a restore, a cut
/// of the log, `palisade recover-counters`): see [`recovery_floors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryFloors {
    /// Every later token is above this one; at [`TOKEN_MAX`] no lock can be granted any more.
    pub token: Token,
    /// Every later session id is above this one.
    pub session: SessionId,
}

impl RecoveryFloors {
    /// Whether the token floor reached [`TOKEN_MAX`]: nothing could be granted after it.
    pub fn exhausted(&self) -> bool {
        self.token >= TOKEN_MAX
    }
}

/// The lowest value above every value a counter known to be at `known` at `known_at_unix_ms`
/// (milliseconds since 1970) can have reached at `now_unix_ms`: it grows at most
/// [`RESTORE_TOKENS_PER_SECOND`] (rounded up), plus [`RECOVERY_MARGIN`]; and never below the
/// time floor of `now` ([`restore_token_floor`]), which covers what nothing recorded. A clock
/// behind `known_at` counts no time. Exact in 128 bits, then saturated at `u64::MAX`.
pub fn recovery_floor(known: u64, known_at_unix_ms: u64, now_unix_ms: u64) -> u64 {
    let elapsed_ms = u128::from(now_unix_ms.saturating_sub(known_at_unix_ms));
    let growth = (elapsed_ms * u128::from(RESTORE_TOKENS_PER_SECOND)).div_ceil(1000);
    let relative = u128::from(known) + growth + u128::from(RECOVERY_MARGIN);
    let time = u128::from(restore_token_floor(now_unix_ms / 1000).get());
    u64::try_from(relative.max(time)).unwrap_or(u64::MAX)
}

/// The floors of both counters after a recovery, from the counters last known (`last_token`,
/// `last_session`, read at `known_at_unix_ms`) and the time now: each [`recovery_floor`], the
/// token's at most [`TOKEN_MAX`] and the session's at most [`SESSION_ID_MAX`].
///
/// The token's floor is also never below the time floor plus [`TOKEN_FLOOR_JUMP_MAX`] plus
/// [`RECOVERY_MARGIN`]: above the highest an operator can have raised the counter without
/// `--force` since the counters were known ([`check_raised_floor`]), however many raises there
/// were, and the grants since (the margin covers the current second's). A backup or a mark taken
/// before such a raise knows nothing of it; this term puts the restored counter above every
/// token granted after it. (Only a forced raise outruns it: take a new backup after one.)
pub fn recovery_floors(
    last_token: Token,
    last_session: SessionId,
    known_at_unix_ms: u64,
    now_unix_ms: u64,
) -> RecoveryFloors {
    if crate::canary::active(crate::canary::Canary::AbsoluteFloors) {
        return RecoveryFloors {
            token: restore_token_floor(now_unix_ms / 1000).min(TOKEN_MAX),
            session: SessionId::new(0),
        };
    }
    RecoveryFloors {
        token: Token::new(
            recovery_floor(last_token.get(), known_at_unix_ms, now_unix_ms)
                .max(
                    unforced_raise_max(now_unix_ms / 1000)
                        .get()
                        .saturating_add(RECOVERY_MARGIN),
                )
                .min(TOKEN_MAX.get()),
        ),
        session: SessionId::new(
            recovery_floor(last_session.get(), known_at_unix_ms, now_unix_ms)
                .min(SESSION_ID_MAX.get()),
        ),
    }
}

/// Token space an operator's raised floor leaves below [`TOKEN_MAX`]: `raise-token-floor`
/// refuses a floor above `TOKEN_MAX - TOKEN_FLOOR_HEADROOM`, even with `--force`. Every later
/// recovery adds [`RESTORE_TOKENS_PER_SECOND`] per second elapsed: 2^56 is a thousand years of
/// that, and a floor at the very limit would leave no lock grantable, for ever.
pub const TOKEN_FLOOR_HEADROOM: u64 = 1 << 56;

/// How far above the time floor ([`restore_token_floor`]) an operator may raise the counter
/// without `--force`: 2^40 (six days of the time floor's growth), far above any token a
/// resource can have seen from a mistake of this cluster's own, far below what would eat the
/// token space. Every recovery places the token counter at least this far above the time floor
/// ([`recovery_floors`]), so an unforced raise never needs a new backup.
pub const TOKEN_FLOOR_JUMP_MAX: u64 = 1 << 40;

/// The highest floor `raise-token-floor` accepts without `--force` at `now_unix_secs`: the time
/// floor plus [`TOKEN_FLOOR_JUMP_MAX`]. Measured from the time, never from the counter, so that
/// no number of unforced raises takes the counter above what a recovery covers.
pub const fn unforced_raise_max(now_unix_secs: u64) -> Token {
    Token::new(
        restore_token_floor(now_unix_secs)
            .get()
            .saturating_add(TOKEN_FLOOR_JUMP_MAX),
    )
}

/// Why an operator's floor is refused ([`check_raised_floor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorRefusal {
    /// Above `token_max - TOKEN_FLOOR_HEADROOM`: refused whatever `force` says.
    TooCloseToMax { highest: Token },
    /// Above `highest` ([`unforced_raise_max`], or lower near the limit) and not forced.
    FarAbove { highest: Token },
}

/// Checks a floor an operator asks for against the counter `last_token`, the time floor of
/// `now_unix_secs` and `token_max` (the table's limit, at most [`TOKEN_MAX`]).
pub fn check_raised_floor(
    floor: Token,
    last_token: Token,
    now_unix_secs: u64,
    token_max: Token,
    force: bool,
) -> Result<(), FloorRefusal> {
    let highest = Token::new(token_max.get().saturating_sub(TOKEN_FLOOR_HEADROOM));
    if floor > highest {
        return Err(FloorRefusal::TooCloseToMax { highest });
    }
    let unforced = unforced_raise_max(now_unix_secs).min(highest);
    if floor > unforced && floor > last_token && !force {
        return Err(FloorRefusal::FarAbove { highest: unforced });
    }
    Ok(())
}

const _: () = assert!(SESSION_TTL_MS_MIN.as_millis() < SESSION_TTL_MS_MAX.as_millis());
// `Limits` holds its counts as `u32` (a replicated value has an explicit width); the table
// compares them with `usize` lengths, which hold any `u32` on every supported target.
const _: () = assert!(usize::BITS >= u32::BITS);
const _: () = assert!(LOCK_DELAY_MS_MAX.as_millis() <= SESSION_TTL_MS_MAX.as_millis());
const _: () = assert!(WAITERS_PER_LOCK_MAX <= SESSIONS_MAX);
const _: () = assert!(TOKEN_MAX.get() <= i64::MAX as u64);
const _: () = assert!(OPEN_KEY_BYTES_MIN >= 16 && OPEN_KEY_BYTES_MIN <= OPEN_KEY_BYTES_MAX);

/// The limits one lock table enforces. Every field must be at most its ceiling above.
///
/// Replicated (in the log's `SetLimits` and in every snapshot), so every field has an explicit
/// width (the durations are [`DurationMs`], the token a [`Token`], each a `u64` stored as its
/// bare number); the JSON form is the same as when the counts were `usize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub lock_name_bytes_max: u32,
    pub session_ttl_ms_min: DurationMs,
    pub session_ttl_ms_max: DurationMs,
    pub sessions_max: u32,
    pub locks_max: u32,
    pub waiters_per_lock_max: u32,
    /// After a holder's session expires, its locks are not granted again for this long.
    pub lock_delay_ms: DurationMs,
    /// The last token the table may grant for any lock; normally [`TOKEN_MAX`].
    pub token_max: Token,
}

impl Default for Limits {
    fn default() -> Self {
        Limits::CEILINGS
    }
}

impl Limits {
    /// Every limit at its ceiling, with no lock-delay: the default.
    const CEILINGS: Limits = Limits {
        lock_name_bytes_max: ceiling(LOCK_NAME_BYTES_MAX),
        session_ttl_ms_min: SESSION_TTL_MS_MIN,
        session_ttl_ms_max: SESSION_TTL_MS_MAX,
        sessions_max: ceiling(SESSIONS_MAX),
        locks_max: ceiling(LOCKS_MAX),
        waiters_per_lock_max: ceiling(WAITERS_PER_LOCK_MAX),
        lock_delay_ms: DurationMs::ZERO,
        token_max: TOKEN_MAX,
    };
}

/// A ceiling as the `u32` a [`Limits`] field holds. Used only in constants, so a ceiling that
/// did not fit would fail the build.
const fn ceiling(value: usize) -> u32 {
    assert!(
        value <= u32::MAX as usize,
        "a ceiling of Limits does not fit in u32"
    );
    value as u32
}

impl Limits {
    /// Checks that every field is within its ceiling and the fields agree with each other.
    pub fn validate(&self) -> Result<(), String> {
        let checks: [(bool, &str); 7] = [
            (
                self.lock_name_bytes_max >= 1
                    && self.lock_name_bytes_max <= Limits::CEILINGS.lock_name_bytes_max,
                "lock_name_bytes_max must be in 1..=256",
            ),
            (
                self.session_ttl_ms_min >= DurationMs::from_millis(1)
                    && self.session_ttl_ms_min <= self.session_ttl_ms_max,
                "session_ttl_ms_min must be at least 1 and at most session_ttl_ms_max",
            ),
            (
                self.session_ttl_ms_max <= SESSION_TTL_MS_MAX,
                "session_ttl_ms_max is above one day",
            ),
            (
                self.sessions_max <= Limits::CEILINGS.sessions_max,
                "sessions_max is above the ceiling",
            ),
            (
                self.locks_max <= Limits::CEILINGS.locks_max,
                "locks_max is above the ceiling",
            ),
            (
                self.waiters_per_lock_max <= Limits::CEILINGS.waiters_per_lock_max,
                "waiters_per_lock_max is above the ceiling",
            ),
            (
                self.lock_delay_ms <= LOCK_DELAY_MS_MAX && self.token_max <= TOKEN_MAX,
                "lock_delay_ms or token_max is above its ceiling",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, message)) => Err((*message).to_string()),
            None => Ok(()),
        }
    }
}

/// Checks a lock name: 1..=`bytes_max` bytes of UTF-8 with no control characters. Outside
/// this crate a name is checked by building a [`crate::LockName`].
pub(crate) fn validate_lock_name(name: &str, bytes_max: usize) -> Result<(), LockNameError> {
    if name.is_empty() {
        return Err(LockNameError::Empty);
    }
    if name.len() > bytes_max {
        return Err(LockNameError::TooLong {
            bytes: name.len() as u64,
            bytes_max: bytes_max as u64,
        });
    }
    if name.chars().any(char::is_control) {
        return Err(LockNameError::ControlCharacter);
    }
    Ok(())
}

/// Checks a grant's value: 1..=[`GRANT_VALUE_BYTES_MAX`] bytes of UTF-8 with no control
/// characters (a value is shown on terminals and web pages; binary data goes in base64).
pub fn validate_grant_value(value: &str) -> Result<(), GrantValueError> {
    if value.is_empty() {
        return Err(GrantValueError::Empty);
    }
    if value.len() > GRANT_VALUE_BYTES_MAX {
        return Err(GrantValueError::TooLong {
            bytes: value.len() as u64,
            bytes_max: GRANT_VALUE_BYTES_MAX as u64,
        });
    }
    if value.chars().any(char::is_control) {
        return Err(GrantValueError::ControlCharacter);
    }
    Ok(())
}

/// Why a grant's value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum GrantValueError {
    #[error("value is empty (send no value instead)")]
    Empty,
    #[error("value is {bytes} bytes, the limit is {bytes_max}")]
    TooLong { bytes: u64, bytes_max: u64 },
    #[error("value contains a control character (encode binary values, in base64 say)")]
    ControlCharacter,
}

impl GrantValueError {
    /// The reason's stable name, in `snake_case` (the wire's `ErrorDetail.reason`).
    pub fn code(&self) -> &'static str {
        match self {
            GrantValueError::Empty => "empty",
            GrantValueError::TooLong { .. } => "too_long",
            GrantValueError::ControlCharacter => "control_character",
        }
    }
}

/// Why a lock name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum LockNameError {
    #[error("lock name is empty")]
    Empty,
    #[error("lock name is {bytes} bytes, the limit is {bytes_max}")]
    TooLong { bytes: u64, bytes_max: u64 },
    #[error("lock name contains a control character")]
    ControlCharacter,
}

impl LockNameError {
    /// The reason's stable name, in `snake_case` (the wire's `ErrorDetail.reason`).
    pub fn code(&self) -> &'static str {
        match self {
            LockNameError::Empty => "empty",
            LockNameError::TooLong { .. } => "too_long",
            LockNameError::ControlCharacter => "control_character",
        }
    }
}

/// Checks an open key: `OPEN_KEY_BYTES_MIN..=OPEN_KEY_BYTES_MAX` bytes, not all of them equal.
///
/// A key whose bytes are all the same (all zero above all) is what an uninitialised buffer or a
/// placeholder gives, never a random draw (a chance of 2⁻¹²⁰ at 16 bytes); two clients sending
/// it would share a session, so it is refused rather than trusted.
pub fn validate_open_key(bytes: &[u8]) -> Result<(), OpenKeyError> {
    if !(OPEN_KEY_BYTES_MIN..=OPEN_KEY_BYTES_MAX).contains(&bytes.len()) {
        return Err(OpenKeyError::Length {
            bytes: bytes.len() as u64,
            bytes_min: OPEN_KEY_BYTES_MIN as u64,
            bytes_max: OPEN_KEY_BYTES_MAX as u64,
        });
    }
    if bytes.iter().all(|b| *b == bytes[0]) {
        return Err(OpenKeyError::NotRandom);
    }
    Ok(())
}

/// Why an open key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum OpenKeyError {
    #[error(
        "open key is {bytes} bytes, it must be {bytes_min}..={bytes_max} random bytes; send none to always open a new session"
    )]
    Length {
        bytes: u64,
        bytes_min: u64,
        bytes_max: u64,
    },
    #[error(
        "open key has every byte equal, so it is not random; draw it from a secure random source"
    )]
    NotRandom,
    /// Only where a key is read back from the log or a snapshot, which spell it in hex.
    #[error("open key is not lowercase hex with two digits per byte")]
    NotHex,
}

impl OpenKeyError {
    /// The reason's stable name, in `snake_case` (the wire's `ErrorDetail.reason`).
    pub fn code(&self) -> &'static str {
        match self {
            OpenKeyError::Length { .. } => "length",
            OpenKeyError::NotRandom => "not_random",
            OpenKeyError::NotHex => "not_hex",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: u64 = 1_780_000_000_000;

    #[test]
    fn a_recovery_floor_is_above_what_the_counter_can_have_reached_since_it_was_known() {
        let time = restore_token_floor(NOW_MS / 1000).get();
        // Far below the time floor: the time floor.
        assert_eq!(recovery_floor(5, NOW_MS - 1_000, NOW_MS), time);
        // Far above it (a counter raised to 2^60): the known value, plus 2^21 a second since
        // (rounded up), plus a second's margin.
        let known = 1 << 60;
        assert_eq!(
            recovery_floor(known, NOW_MS - 2_500, NOW_MS),
            known + 5 * (RESTORE_TOKENS_PER_SECOND / 2) + RECOVERY_MARGIN
        );
        assert_eq!(
            recovery_floor(known, NOW_MS - 1, NOW_MS),
            known + RESTORE_TOKENS_PER_SECOND.div_ceil(1000) + RECOVERY_MARGIN
        );
        // A clock behind the moment the counter was known counts no time, margin kept.
        assert_eq!(
            recovery_floor(known, NOW_MS + 60_000, NOW_MS),
            known + RECOVERY_MARGIN
        );
    }

    #[test]
    fn a_token_recovery_floor_is_above_every_counter_an_unforced_raise_can_have_made() {
        // Known at 5 an hour ago; since then, any number of raises without --force, each at
        // most `unforced_raise_max` of its second, and grants at up to 2^21 a second after.
        let now_ms = NOW_MS + 999;
        let known_at = now_ms - 3_600_000;
        let floors = recovery_floors(Token::new(5), SessionId::new(5), known_at, now_ms);
        for raised_at_ms in [known_at, NOW_MS - 1, NOW_MS, now_ms] {
            let granted_since = (now_ms - raised_at_ms) * RESTORE_TOKENS_PER_SECOND / 1000;
            let highest = unforced_raise_max(raised_at_ms / 1000).get() + granted_since;
            assert!(floors.token.get() >= highest, "raised at {raised_at_ms}");
        }
        // The session counter is never raised by an operator: its floor has no such term.
        assert_eq!(
            floors.session,
            SessionId::new(restore_token_floor(NOW_MS / 1000).get())
        );
    }

    #[test]
    fn recovery_floors_saturate_at_the_largest_token_and_session_without_overflow() {
        for known in [TOKEN_MAX.get() - 1, TOKEN_MAX.get(), u64::MAX - 1, u64::MAX] {
            assert_eq!(recovery_floor(known, 0, u64::MAX), u64::MAX, "{known}");
            let floors = recovery_floors(
                Token::new(known),
                SessionId::new(known),
                NOW_MS - 1_000,
                NOW_MS,
            );
            assert_eq!(floors.token, TOKEN_MAX, "{known}");
            assert_eq!(floors.session, SESSION_ID_MAX, "{known}");
            assert!(floors.exhausted());
        }
        // A year at the full rate from 2^62 stays below the limit.
        let year_ms = 365 * 86_400_000;
        let floors = recovery_floors(
            Token::new(1 << 62),
            SessionId::new(1),
            NOW_MS - year_ms,
            NOW_MS,
        );
        assert!(!floors.exhausted());
        assert!(floors.token.get() > (1 << 62) + year_ms / 1000 * RESTORE_TOKENS_PER_SECOND);
        assert_eq!(
            floors.session,
            SessionId::new(restore_token_floor(NOW_MS / 1000).get())
        );
    }

    #[test]
    fn an_operators_floor_near_the_limit_is_refused_and_one_far_above_needs_force() {
        let now = NOW_MS / 1000;
        let time = restore_token_floor(now);
        let counter = Token::new(10);
        let ok = |floor: u64, force| {
            check_raised_floor(Token::new(floor), counter, now, TOKEN_MAX, force)
        };
        // Up to the time floor plus 2^40: no force needed.
        assert_eq!(
            unforced_raise_max(now).get(),
            time.get() + TOKEN_FLOOR_JUMP_MAX
        );
        assert_eq!(ok(1 << 40, false), Ok(()));
        assert_eq!(ok(time.get() + TOKEN_FLOOR_JUMP_MAX, false), Ok(()));
        // Above it: only with force.
        let far = time.get() + TOKEN_FLOOR_JUMP_MAX + 1;
        assert_eq!(
            ok(far, false),
            Err(FloorRefusal::FarAbove {
                highest: Token::new(time.get() + TOKEN_FLOOR_JUMP_MAX)
            })
        );
        assert_eq!(ok(far, true), Ok(()));
        assert_eq!(ok(1 << 60, true), Ok(()));
        // Near the limit: never, forced or not.
        let highest = Token::new(TOKEN_MAX.get() - TOKEN_FLOOR_HEADROOM);
        assert_eq!(ok(highest.get(), true), Ok(()));
        for floor in [highest.get() + 1, TOKEN_MAX.get(), u64::MAX] {
            for force in [false, true] {
                assert_eq!(
                    ok(floor, force),
                    Err(FloorRefusal::TooCloseToMax { highest }),
                    "{floor} {force}"
                );
            }
        }
        // A counter already far up (a forced raise): the jump is still measured from the time,
        // so unforced raises never outrun what a recovery covers; a floor at or below the
        // counter changes nothing and needs no force.
        let high = Token::new(1 << 61);
        let raise = |floor: u64| check_raised_floor(Token::new(floor), high, now, TOKEN_MAX, false);
        assert_eq!(raise(1 << 61), Ok(()));
        assert_eq!(
            raise((1 << 61) + 1),
            Err(FloorRefusal::FarAbove {
                highest: Token::new(time.get() + TOKEN_FLOOR_JUMP_MAX)
            })
        );
        // A table limit below TOKEN_MAX (tests) keeps the same headroom without underflow.
        assert_eq!(
            check_raised_floor(Token::new(1), Token::ZERO, now, Token::new(5), true),
            Err(FloorRefusal::TooCloseToMax {
                highest: Token::ZERO
            })
        );
    }
}
