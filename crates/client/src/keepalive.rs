//! The keepalive engine: a session's keepalive rules as a state machine without I/O.
//!
//! The session's tokio task (`session.rs`) feeds it timed [`Event`]s ([`Keepalive::on`]) and
//! performs the [`Action`]s it returns; it holds no rules of its own. The same engine is written
//! in Python (`palisade._keepalive`, driven by a thread and by an asyncio task) and in Go, and
//! every one of them passes the shared vectors in `spec/keepalive/v2` (its README states every
//! rule; the tests at the end of this file run them all). Times are integer milliseconds on the
//! client's monotonic clock.
//!
//! Where the three earlier copies (this crate's `Pinger`, Python's blocking and asyncio
//! sessions) disagreed, the engine takes the safe side:
//! - an event at or after the lease deadline makes the session lost before it is looked at (the
//!   blocking Python client took an ack in first): the application may already have acted on a
//!   lease that ran out, and a lost session never comes back;
//! - a `Renew` call may take only what is left of the lease, and the session is lost at the
//!   deadline while the call is in flight (the blocking client waited for its budget to run out);
//! - a refusal (`RESOURCE_EXHAUSTED`) renews by call whenever it comes (this crate paused after
//!   one on an open stream): a renewal is idempotent and bounded by the lease, a pause is not;
//! - the next ping is due an interval after the stream opened (its headers came), as here and in
//!   the asyncio client (the blocking one counted from the call); a stream that has not opened an
//!   interval after it was asked for is closed as stuck and the lease renewed by call, as after a
//!   refusal: a refusal that comes late and a member that accepts the stream and never answers
//!   (HTTP/2's keepalive does not notice a wedged handler) both renew by call, and neither leaves
//!   the session waiting on a silent stream until its lease ends (vector 027);
//! - the backoff runs on the engine's clock (this crate's ran on the process's clock even under a
//!   test clock).

use std::collections::VecDeque;

/// Why a session was lost, as the vectors spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LostReason {
    /// No renewal was proven within the lease.
    LeaseUnproven,
    /// The server says the session does not exist.
    NotFound,
}

/// Why the engine closes the open stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// Its oldest ping went unanswered for an interval: move on from the endpoint.
    Stuck,
    /// The lease ran out; a new stream follows at once.
    LeaseEnded,
}

/// What happened, fed with the time it happened at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// The session was opened: start keeping it alive.
    Start,
    /// A timer fired (or any time at all; a tick before [`Keepalive::wake`] does nothing).
    Tick,
    /// The open stream's response headers came.
    StreamOpened,
    /// The open stream answered a ping of this session.
    Ack { ttl_remaining_ms: u64 },
    /// The open stream failed or ended (not refused, not gone); `leader_named` when a member
    /// named the leader, and the client already moved there.
    StreamBroken { leader_named: bool },
    /// The stream ended with `RESOURCE_EXHAUSTED`: no keepalive stream to spare.
    StreamRefused,
    /// The stream or the `Renew` call said the session does not exist.
    SessionGone,
    /// The `Renew` call succeeded.
    RenewAnswered { ttl_remaining_ms: u64 },
    /// The `Renew` call failed otherwise (or ran out of its budget).
    RenewFailed,
}

/// What the driver does, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Open a stream to the current endpoint, its first ping with it.
    OpenStream,
    /// Write one ping on the open stream.
    SendPing,
    /// Cancel the open stream.
    CloseStream(CloseReason),
    /// Call `Renew` once (with retries), giving up at `until` if there is one.
    Renew { until: Option<u64> },
    /// Abandon the `Renew` call in flight.
    CancelRenew,
    /// No stream and no call until `until`.
    Pause { until: u64 },
    /// Report the session lost (once).
    Lost(LostReason),
    /// The keepalive is over: the session does not exist.
    Stop,
}

const BACKOFF_INITIAL_MS: u64 = 50;
const BACKOFF_MAX_MS: u64 = 1000;
const RETRIES_AT_ONCE_MAX: u32 = 3;
const INTERVAL_MIN_MS: u64 = 10;

/// How much of a reported lease remainder the client counts on. The server's lease is measured
/// from when it applied the renewal, after the client sent it, so counting from the send time is
/// already conservative; the margin also covers a late timer here (20 ms) and the two machines'
/// monotonic clocks running at rates up to 0.2 % apart (rounded up), so that the session is lost
/// here no later than the server could grant its locks to someone else.
pub(crate) fn proven_lease(remaining_ms: u64) -> u64 {
    remaining_ms.saturating_sub(20 + (2 * remaining_ms).div_ceil(1000))
}

/// The jitter's generator, SplitMix64: the same numbers in every client, so vectors can fix them.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    /// A number in [0, 1).
    fn fraction(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Exponential backoff within a budget, with a few attempts at once, on the engine's clock.
#[derive(Debug, Clone)]
struct Backoff {
    budget_ms: u64,
    step: u64,
    give_up_at: u64,
    at_once_left: u32,
}

impl Backoff {
    fn new(now: u64, budget_ms: u64) -> Backoff {
        Backoff {
            budget_ms,
            step: BACKOFF_INITIAL_MS,
            give_up_at: now + budget_ms,
            at_once_left: RETRIES_AT_ONCE_MAX,
        }
    }

    fn reset(&mut self, now: u64) {
        *self = Backoff::new(now, self.budget_ms);
    }

    fn at_once(&mut self, now: u64) -> bool {
        if self.at_once_left == 0 || now >= self.give_up_at {
            return false;
        }
        self.at_once_left -= 1;
        true
    }

    fn next_delay(&mut self, now: u64, rng: Option<&mut SplitMix64>) -> Option<u64> {
        if now >= self.give_up_at {
            return None;
        }
        let step = match rng {
            // Between half and all of the step; the product is below 2^53, so exact enough.
            Some(rng) => (self.step as f64 * (0.5 + rng.fraction() / 2.0)) as u64,
            None => self.step,
        };
        let delay = step.min(self.give_up_at - now);
        self.step = (self.step * 2).min(BACKOFF_MAX_MS);
        self.at_once_left = RETRIES_AT_ONCE_MAX;
        Some(delay)
    }
}

#[derive(Debug, Clone)]
enum State {
    Idle,
    /// A stream is open; `sent_at` holds the send times of its unanswered pings, oldest first;
    /// no ping is due (`None`) until its headers came, which must be by `open_by`.
    Streaming {
        sent_at: VecDeque<u64>,
        next_ping: Option<u64>,
        open_by: u64,
    },
    Renewing {
        sent: u64,
    },
    Waiting {
        until: u64,
    },
    Stopped,
}

/// One session's keepalive: feed [`Keepalive::on`] events, perform what it returns, and feed a
/// [`Event::Tick`] by [`Keepalive::wake`] at the latest.
#[derive(Debug, Clone)]
pub(crate) struct Keepalive {
    ttl_ms: u64,
    interval_ms: u64,
    /// The proven lease deadline; `None` once the session is lost (renewed best effort).
    lease_deadline: Option<u64>,
    rng: Option<SplitMix64>,
    backoff: Backoff,
    state: State,
}

impl Keepalive {
    /// The keepalive of a session granted `ttl_ms` by an `OpenSession` sent at `opened_at_ms`,
    /// pinged every `interval_ms` (`None`: a third of the ttl; clamped to 10 ms ..= ttl), its
    /// backoff jittered from `jitter_seed` (`None`: no jitter).
    pub(crate) fn new(
        ttl_ms: u64,
        interval_ms: Option<u64>,
        opened_at_ms: u64,
        jitter_seed: Option<u64>,
    ) -> Keepalive {
        let interval = interval_ms.unwrap_or(ttl_ms / 3);
        Keepalive {
            ttl_ms,
            interval_ms: interval.max(INTERVAL_MIN_MS).min(ttl_ms),
            lease_deadline: Some(opened_at_ms + proven_lease(ttl_ms)),
            rng: jitter_seed.map(SplitMix64),
            backoff: Backoff::new(opened_at_ms, ttl_ms),
            state: State::Idle,
        }
    }

    /// The proven lease deadline, or `None` once the session is lost.
    pub(crate) fn lease_deadline(&self) -> Option<u64> {
        self.lease_deadline
    }

    /// True once the keepalive is over ([`Action::Stop`] was returned).
    pub(crate) fn stopped(&self) -> bool {
        matches!(self.state, State::Stopped)
    }

    /// The latest time to feed a tick, or `None` (waiting for I/O only, or stopped).
    pub(crate) fn wake(&self) -> Option<u64> {
        let at = match &self.state {
            State::Streaming {
                next_ping, open_by, ..
            } => Some(next_ping.unwrap_or(*open_by)),
            State::Waiting { until } => Some(*until),
            State::Renewing { .. } => None,
            State::Idle | State::Stopped => return None,
        };
        match (at, self.lease_deadline) {
            (Some(at), Some(deadline)) => Some(at.min(deadline)),
            (at, deadline) => at.or(deadline),
        }
    }

    /// Takes in `event` at `now`; returns what to do, in order.
    pub(crate) fn on(&mut self, event: Event, now: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.stopped() {
            return actions;
        }
        if self.lease_deadline.is_some_and(|deadline| now >= deadline) {
            self.lose(now, &mut actions);
            return actions;
        }
        match (event, &mut self.state) {
            (Event::Start, State::Idle) => self.open(now, &mut actions),
            (
                Event::StreamOpened,
                State::Streaming {
                    next_ping: next_ping @ None,
                    ..
                },
            ) => *next_ping = Some(now + self.interval_ms),
            (
                Event::Tick,
                State::Streaming {
                    next_ping: None,
                    open_by,
                    ..
                },
            ) if now >= *open_by => {
                // Never opened (a silent member, or a refusal still to come): renew as if refused.
                actions.push(Action::CloseStream(CloseReason::Stuck));
                self.renew(now, &mut actions);
            }
            (
                Event::Tick,
                State::Streaming {
                    sent_at, next_ping, ..
                },
            ) if next_ping.is_some_and(|at| now >= at) => {
                if sent_at
                    .front()
                    .is_some_and(|sent| now - sent >= self.interval_ms)
                {
                    actions.push(Action::CloseStream(CloseReason::Stuck));
                    self.failed(now, false, &mut actions);
                } else {
                    sent_at.push_back(now);
                    *next_ping = Some(now + self.interval_ms);
                    actions.push(Action::SendPing);
                }
            }
            (Event::Tick, State::Waiting { until }) if now >= *until => {
                self.open(now, &mut actions)
            }
            (Event::Ack { ttl_remaining_ms }, State::Streaming { sent_at, .. }) => {
                if let Some(sent) = sent_at.pop_front() {
                    self.proven(sent, ttl_remaining_ms);
                    self.backoff.reset(now);
                }
            }
            (Event::StreamBroken { leader_named }, State::Streaming { .. }) => {
                self.failed(now, leader_named, &mut actions)
            }
            (Event::StreamRefused, State::Streaming { .. }) => self.renew(now, &mut actions),
            (Event::SessionGone, State::Streaming { .. } | State::Renewing { .. }) => {
                if self.lease_deadline.take().is_some() {
                    actions.push(Action::Lost(LostReason::NotFound));
                }
                self.state = State::Stopped;
                actions.push(Action::Stop);
            }
            (Event::RenewAnswered { ttl_remaining_ms }, State::Renewing { sent }) => {
                let sent = *sent;
                self.proven(sent, ttl_remaining_ms);
                self.backoff.reset(now);
                let until = sent + self.interval_ms;
                if until > now {
                    self.state = State::Waiting { until };
                    actions.push(Action::Pause { until });
                } else {
                    self.open(now, &mut actions);
                }
            }
            (Event::RenewFailed, State::Renewing { .. }) => self.pause(now, &mut actions),
            _ => {} // Stale, or early: nothing to do.
        }
        actions
    }

    fn open(&mut self, now: u64, actions: &mut Vec<Action>) {
        self.state = State::Streaming {
            sent_at: VecDeque::from([now]),
            next_ping: None,
            open_by: now + self.interval_ms,
        };
        actions.push(Action::OpenStream);
    }

    fn renew(&mut self, now: u64, actions: &mut Vec<Action>) {
        self.state = State::Renewing { sent: now };
        actions.push(Action::Renew {
            until: self.lease_deadline,
        });
    }

    fn proven(&mut self, sent: u64, remaining_ms: u64) {
        let proven = sent + proven_lease(remaining_ms.min(self.ttl_ms));
        if let Some(deadline) = self.lease_deadline.as_mut()
            && proven > *deadline
        {
            *deadline = proven;
        }
    }

    fn failed(&mut self, now: u64, leader_named: bool, actions: &mut Vec<Action>) {
        if leader_named && self.backoff.at_once(now) {
            self.open(now, actions);
        } else {
            self.pause(now, actions);
        }
    }

    fn pause(&mut self, now: u64, actions: &mut Vec<Action>) {
        let mut delay = self
            .backoff
            .next_delay(now, self.rng.as_mut())
            .unwrap_or(BACKOFF_MAX_MS);
        if self.lease_deadline.is_none() {
            delay = delay.min(self.interval_ms);
        }
        let until = now + delay;
        self.state = State::Waiting { until };
        actions.push(Action::Pause { until });
    }

    fn lose(&mut self, now: u64, actions: &mut Vec<Action>) {
        match self.state {
            State::Streaming { .. } => actions.push(Action::CloseStream(CloseReason::LeaseEnded)),
            State::Renewing { .. } => actions.push(Action::CancelRenew),
            _ => {}
        }
        actions.push(Action::Lost(LostReason::LeaseUnproven));
        self.lease_deadline = None;
        self.backoff = Backoff::new(now, self.ttl_ms);
        self.open(now, actions);
    }
}

#[cfg(test)]
mod tests {
    //! Every vector of `spec/keepalive/v2`, step by step.

    use super::*;
    use serde_json::{Map, Value, json};
    use std::path::{Path, PathBuf};

    fn vectors() -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spec/keepalive/v2");
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .collect();
        paths.sort();
        paths
    }

    fn fields(object: &Map<String, Value>, required: &[&str], optional: &[&str], at: &str) {
        for key in required {
            assert!(object.contains_key(*key), "{at}: missing {key}");
        }
        for key in object.keys() {
            assert!(
                key.starts_with('_') || required.contains(&&**key) || optional.contains(&&**key),
                "{at}: unknown field {key}"
            );
        }
    }

    fn number(value: &Value, at: &str) -> u64 {
        value
            .as_u64()
            .unwrap_or_else(|| panic!("{at}: {value} is no time"))
    }

    fn optional_number(value: Option<&Value>, at: &str) -> Option<u64> {
        value.filter(|v| !v.is_null()).map(|v| number(v, at))
    }

    fn event(raw: &Value, at: &str) -> Event {
        let object = raw.as_object().expect("an event is an object");
        let kind = object["type"].as_str().expect("an event has a type");
        let (required, optional): (&[&str], &[&str]) = match kind {
            "ack" | "renew_answered" => (&["type", "ttl_remaining_ms"], &[]),
            "stream_broken" => (&["type"], &["leader_named"]),
            _ => (&["type"], &[]),
        };
        fields(object, required, optional, at);
        let remaining = || number(&object["ttl_remaining_ms"], at);
        match kind {
            "start" => Event::Start,
            "tick" => Event::Tick,
            "stream_opened" => Event::StreamOpened,
            "ack" => Event::Ack {
                ttl_remaining_ms: remaining(),
            },
            "stream_broken" => Event::StreamBroken {
                leader_named: object.get("leader_named").is_some_and(|v| v == true),
            },
            "stream_refused" => Event::StreamRefused,
            "session_gone" => Event::SessionGone,
            "renew_answered" => Event::RenewAnswered {
                ttl_remaining_ms: remaining(),
            },
            "renew_failed" => Event::RenewFailed,
            other => panic!("{at}: unknown event type {other}"),
        }
    }

    fn action_json(action: Action) -> Value {
        match action {
            Action::OpenStream => json!({"type": "open_stream"}),
            Action::SendPing => json!({"type": "send_ping"}),
            Action::CloseStream(reason) => json!({"type": "close_stream", "reason": match reason {
                CloseReason::Stuck => "stuck",
                CloseReason::LeaseEnded => "lease_ended",
            }}),
            Action::Renew { until } => json!({"type": "renew", "until": until}),
            Action::CancelRenew => json!({"type": "cancel_renew"}),
            Action::Pause { until } => json!({"type": "pause", "until": until}),
            Action::Lost(reason) => json!({"type": "lost", "reason": match reason {
                LostReason::LeaseUnproven => "lease_unproven",
                LostReason::NotFound => "not_found",
            }}),
            Action::Stop => json!({"type": "stop"}),
        }
    }

    fn run(path: &Path) {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let case: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let case = case.as_object().expect("a case is an object");
        fields(case, &["description", "config", "steps"], &[], &name);
        let config = case["config"].as_object().expect("config is an object");
        let at = format!("{name} config");
        fields(
            config,
            &["ttl_ms", "opened_at_ms"],
            &["interval_ms", "jitter_seed"],
            &at,
        );
        let mut engine = Keepalive::new(
            number(&config["ttl_ms"], &at),
            optional_number(config.get("interval_ms"), &at),
            number(&config["opened_at_ms"], &at),
            optional_number(config.get("jitter_seed"), &at),
        );
        let mut last = 0;
        for (index, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            let step = step.as_object().expect("a step is an object");
            let now = number(&step["at"], &name);
            let at = format!("{name} step {index} (at {now})");
            fields(
                step,
                &["at", "event", "actions"],
                &["wake", "lease_deadline"],
                &at,
            );
            assert!(now >= last, "{at}: time goes back");
            last = now;
            let actions: Vec<Value> = engine
                .on(event(&step["event"], &at), now)
                .into_iter()
                .map(action_json)
                .collect();
            assert_eq!(Value::from(actions), step["actions"], "{at}: actions");
            if let Some(wake) = step.get("wake") {
                assert_eq!(json!(engine.wake()), *wake, "{at}: wake");
            }
            if let Some(deadline) = step.get("lease_deadline") {
                assert_eq!(
                    json!(engine.lease_deadline()),
                    *deadline,
                    "{at}: lease_deadline"
                );
            }
        }
    }

    #[test]
    fn every_shared_vector_passes() {
        let paths = vectors();
        assert!(paths.len() >= 20, "only {} vectors", paths.len());
        for path in paths {
            run(&path);
        }
    }
}
