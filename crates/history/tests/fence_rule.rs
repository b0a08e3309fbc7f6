//! The resource's comparison, `<` against `≤`, fed to the checker from the real fence.
//!
//! `palisade_fence::check` refuses a token only if it is *below* the accepted one (`<`), so a
//! holder may read and then write under one grant. A resource that refused an equal token too
//! (`≤`) would refuse the holder's own write after its fenced read: the checker must catch the
//! history that rule produces. And the fence takes an equal token only from the session that
//! presented it first: a service that granted one token twice is caught at the service
//! (check 2), and the resource refuses the second holder, so its history stays in order.

mod common;

use common::*;
use palisade_core::{SessionId, Token};
use palisade_fence::{FenceError, FenceState, LockBinding};
use palisade_history::{Access, Check, Grant, History, Outcome, Reply};
use palisade_sequencer::{KeySet, SigningKey, VerifiedSequencer};

/// How the resource compares a presented token with the accepted one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// `palisade_fence::check`: stale only if below.
    Fence,
    /// The mistake: stale if below or equal.
    RefuseEqual,
}

/// One scope of a resource holding a counter, with the fence beside it, recording every access.
struct Resource {
    rule: Rule,
    key: SigningKey,
    state: Option<FenceState>,
    value: Option<i64>,
    clock_ns: u64,
}

impl Resource {
    fn new(rule: Rule) -> Resource {
        Resource {
            rule,
            key: SigningKey::from_bytes([7; 32]),
            state: None,
            value: None,
            clock_ns: 0,
        }
    }

    fn sequencer(&self, g: Grant) -> VerifiedSequencer {
        let sequencer = self.key.sign("counter", g.token, g.session).unwrap();
        sequencer
            .verify(&KeySet::from(self.key.public_key()))
            .unwrap()
    }

    fn fence(&self, g: Grant) -> Result<FenceState, FenceError> {
        let advanced = palisade_fence::check(
            self.state.as_ref(),
            LockBinding::Expect("counter"),
            &self.sequencer(g),
            // The history records reads and writes of an exclusive grant: decided alike.
            palisade_fence::Intent::Write,
        )?;
        let equal = self.state.as_ref().is_some_and(|s| s.token_max == g.token);
        if self.rule == Rule::RefuseEqual && equal {
            let accepted = self.state.as_ref().expect("checked");
            return Err(FenceError::Stale {
                lock: accepted.lock.clone(),
                presented: g.token,
                accepted: accepted.token_max,
                holder_session: Some(accepted.holder_session),
            });
        }
        Ok(advanced)
    }

    /// Runs `access` as the holder of `g`, recording it in `h` over the next 10 ns.
    fn access(&mut self, h: &mut History, g: Grant, access: Access) -> Outcome {
        let outcome = match self.fence(g) {
            Ok(advanced) => {
                self.state = Some(advanced);
                let value = match access {
                    Access::Read => Some(self.value.unwrap_or(0)),
                    Access::Claim => None,
                    Access::Write { value } => {
                        self.value = Some(value);
                        None
                    }
                };
                Outcome::Ok(Reply::Accepted {
                    value,
                    position: None,
                })
            }
            Err(error) => {
                assert!(
                    error.is_stale() || matches!(error, FenceError::TokenReissued { .. }),
                    "{error}"
                );
                Outcome::Ok(Reply::Stale)
            }
        };
        let start = self.clock_ns;
        self.clock_ns += 10;
        common::access(
            h,
            g.session.get(),
            Some(g),
            access,
            (start, start + 5),
            outcome,
        );
        outcome
    }

    /// A holder's critical section: a fenced read, then the value plus one.
    fn increment(&mut self, h: &mut History, g: Grant) {
        if let Outcome::Ok(Reply::Accepted { value, .. }) = self.access(h, g, Access::Read) {
            let value = value.expect("a read returns the value");
            self.access(h, g, Access::Write { value: value + 1 });
        }
    }
}

/// Three holders in turn, each incrementing the counter; the first one, superseded, then tries
/// to write again.
fn run(rule: Rule) -> History {
    let mut h = History::new(0).unwrap();
    let mut resource = Resource::new(rule);
    for token in 1..=3 {
        resource.increment(&mut h, grant(token, token));
    }
    resource.access(&mut h, grant(1, 1), Access::Write { value: 10 });
    h
}

#[test]
fn the_fences_rule_gives_a_clean_history() {
    let h = run(Rule::Fence);
    assert_eq!(violations(&h), []);
    let stale = h.ops().iter().filter(|op| op.outcome == STALE).count();
    assert_eq!(stale, 1, "only the superseded holder's write is refused");
}

#[test]
fn refusing_an_equal_token_is_caught() {
    let h = run(Rule::RefuseEqual);
    let found: Vec<Check> = violations(&h).iter().map(|v| v.check()).collect();
    assert!(!found.is_empty());
    assert!(found.iter().all(|&c| c == Check::FenceOrder), "{found:?}");
}

#[test]
fn a_token_granted_twice_is_caught_at_the_service_and_refused_to_the_second_session() {
    // A broken service grants token 3 to sessions 1 and 2; the fence accepts the first only.
    let mut h = History::new(0).unwrap();
    acquire(&mut h, 1, "counter", (0, 5), granted(1, 3));
    acquire(&mut h, 2, "counter", (0, 5), granted(2, 3));
    let mut resource = Resource::new(Rule::Fence);
    resource.clock_ns = 10;
    let first = resource.access(&mut h, grant(1, 3), Access::Claim);
    let second = resource.access(&mut h, grant(2, 3), Access::Claim);
    assert!(matches!(first, Outcome::Ok(Reply::Accepted { .. })));
    assert_eq!(
        second, STALE,
        "the fence refuses an equal token from another session"
    );
    assert_eq!(
        resource
            .state
            .as_ref()
            .map(|s| (s.token_max, s.holder_session)),
        Some((Token::new(3), SessionId::new(1)))
    );

    let found: Vec<Check> = violations(&h).iter().map(|v| v.check()).collect();
    assert_eq!(found, [Check::TokensUnique]);
}
