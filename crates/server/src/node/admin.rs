//! Administrative operations: backup, the token floor and the cluster's keys.

use palisade_core::{Command, Token};
use palisade_sequencer::KeyId;

use super::Node;
use super::membership::{MembershipError, administrative};
use crate::keyring::{KeyChange, KeyRefusal, KeyRing, KeyView, Secret};
use crate::raft_types::Proposal;

/// A change to the cluster's keys an operator asks for (`palisade keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRequest {
    /// Publish a new key, which does not sign yet.
    Add,
    /// Sign with the given published key, or with the newest one published after the key that
    /// signs now.
    Rotate(Option<KeyId>),
    /// Stop publishing a key that no longer signs.
    Retire(KeyId),
}

impl Node {
    /// A backup of everything committed before the call (see [`crate::backup`]).
    pub async fn backup(&self) -> Result<Vec<u8>, MembershipError> {
        self.leading_term()?;
        self.linearizable_read()
            .await
            .map_err(MembershipError::NotLeader)?;
        let now_ms = crate::counters::now_unix_ms();
        Ok(
            crate::backup::Backup::new(self.shared.applied_copy(), &self.founding_key(), now_ms)
                .to_bytes(),
        )
    }

    /// The published keys and which one signs, read linearizably on the leader.
    pub async fn list_keys(&self) -> Result<Vec<KeyView>, MembershipError> {
        self.linearizable_read()
            .await
            .map_err(MembershipError::NotLeader)?;
        Ok(self.key_views())
    }

    /// Raises the token counter to at least `floor` (never lowers it): every later grant's
    /// token is above it. Returns the counter afterwards. A floor within
    /// [`palisade_core::limits::TOKEN_FLOOR_HEADROOM`] of the largest token is refused; one
    /// above both the counter and [`palisade_core::limits::unforced_raise_max`] only with
    /// `force` (finding N5).
    pub async fn raise_token_floor(
        &self,
        floor: Token,
        force: bool,
    ) -> Result<Token, MembershipError> {
        use palisade_core::limits::{FloorRefusal, check_raised_floor};
        let (token_max, last_token) = self.shared.read(|t| (t.limits().token_max, t.last_token()));
        let now_secs = crate::counters::now_unix_ms() / 1000;
        match check_raised_floor(floor, last_token, now_secs, token_max, force) {
            Ok(()) => {}
            Err(FloorRefusal::TooCloseToMax { highest }) => {
                return Err(MembershipError::Refused(format!(
                    "a floor of {} leaves too little room below the largest token ({}): the \
                     highest floor allowed is {}, even with --force. The counter never goes \
                     down, and every later recovery adds to it; at the limit no lock could be \
                     granted again. A resource that accepted a token this high needs its stored \
                     token reset by hand (docs/security.md)",
                    floor.get(),
                    token_max.get(),
                    highest.get()
                )));
            }
            Err(FloorRefusal::FarAbove { highest }) => {
                return Err(MembershipError::Refused(format!(
                    "a floor of {} is far above the time floor (2^21 a second since 1970) and \
                     the token counter ({}); without --force the highest is {}. Check the \
                     number: the counter never goes down, so --force spends that token space \
                     for ever, every later restore or recovery builds on it, and a backup taken \
                     before a forced raise restores below it: take a new backup after one",
                    floor.get(),
                    last_token.get(),
                    highest.get()
                )));
            }
        }
        let output = self
            .propose(Command::RaiseTokenFloor {
                floor,
                session_floor: None,
            })
            .await
            .map_err(|e| {
                administrative(
                    e,
                    "the floor may or may not have been raised: raising it again is harmless",
                )
            })?;
        match output.result {
            Ok(palisade_core::Reply::TokenFloorRaised { last_token }) => Ok(last_token),
            other => Err(MembershipError::Failed(format!(
                "unexpected answer to raising the token floor: {other:?}"
            ))),
        }
    }

    /// Changes the cluster's keys (see `keyring`) and returns them as they are after.
    /// Checked here against the current ring, then committed as one Raft entry.
    pub async fn change_keys(&self, request: KeyRequest) -> Result<Vec<KeyView>, MembershipError> {
        let term = self.leading_term()?;
        // Every earlier change is applied here before the request is checked against the ring.
        self.linearizable_read()
            .await
            .map_err(MembershipError::NotLeader)?;
        let ring = self.shared.read_keys(KeyRing::clone);
        let change =
            match request {
                KeyRequest::Add => KeyChange::Add {
                    founding: Secret::of(&self.founding_key()),
                    key: Secret::of(&crate::entropy::signing_key().map_err(|e| {
                        MembershipError::Failed(format!("cannot generate a key: {e}"))
                    })?),
                },
                KeyRequest::Rotate(to) => KeyChange::Rotate {
                    key: match to {
                        Some(key) => key,
                        None => ring.next().ok_or_else(|| {
                            MembershipError::Refused(KeyRefusal::NothingToRotateTo.to_string())
                        })?,
                    },
                },
                KeyRequest::Retire(key) => KeyChange::Retire { key },
            };
        ring.clone()
            .apply(&change)
            .map_err(|refusal| MembershipError::Refused(refusal.to_string()))?;
        self.propose_payload(
            &term,
            Proposal::Keys {
                keys: change.clone(),
            },
        )
        .await
        .map_err(|e| {
            administrative(
                e,
                "the key change may or may not have taken effect: see `palisade keys list`",
            )
        })?;
        // Add and retire leave a non-empty ring, so the ring alone says whether they applied.
        let done = self.shared.read_keys(|after| match &change {
            KeyChange::Add { key, .. } => after.publishes(key.id()),
            KeyChange::Rotate { key } => after.signing().is_some_and(|k| k.key_id() == *key),
            KeyChange::Retire { key } => !after.publishes(*key),
        });
        if !done {
            return Err(MembershipError::Refused(
                "another key change was committed first and this one no longer applied: see `palisade keys list`".into(),
            ));
        }
        tracing::info!(?change, "keys changed");
        Ok(self.key_views())
    }
}
