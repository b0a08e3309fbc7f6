//! The lease driver: proposes a `Tick` whenever the lock table's next deadline (a lease end, a
//! wait deadline, a lock-delay end) has come, so expiries are log entries like everything else.
//!
//! The driver and the state machine meet at the
//! [`LeaseAlarm`](crate::state_machine::LeaseAlarm): the driver sets the table time at which it
//! will look next, and the state machine wakes it only when an applied batch brings an earlier
//! deadline or a snapshot replaces the table.

use std::sync::Arc;

use super::leadership::Term;
use super::{Node, ProposeError};
use palisade_core::{Command, TimeMs};

impl Node {
    /// Proposes a `Tick` whenever the table's next deadline has come, for as long as `term`
    /// lasts.
    pub(super) async fn drive_leases(self: Arc<Self>, term: Arc<Term>) {
        let mut stopping = self.stopping.subscribe();
        let ended = |node: &Node| {
            !node
                .leading
                .borrow()
                .as_ref()
                .is_some_and(|now| Arc::ptr_eq(now, &term))
        };
        loop {
            if *stopping.borrow_and_update() || ended(&self) {
                return;
            }
            let notified = self.shared.lease_alarm().notified();
            let next = self.shared.read(|t| t.next_deadline_ms());
            // Announce the alarm, then look again (see `LeaseAlarm`).
            let alarm = next.unwrap_or(TimeMs::MAX);
            self.shared.lease_alarm().set(alarm);
            if self
                .shared
                .read(|t| t.next_deadline_ms())
                .is_some_and(|deadline| deadline < alarm)
            {
                continue;
            }
            let now = term.clock.now_ms();
            match next {
                Some(deadline) if deadline <= now => {
                    tracing::debug!(
                        deadline = deadline.as_millis(),
                        now = now.as_millis(),
                        base_ms = term.clock.base_ms.as_millis(),
                        "lease driver ticks"
                    );
                    match self.propose_in(&term, Command::Tick).await {
                        Ok(_) => continue,
                        Err(ProposeError::Stopped(reason)) => {
                            tracing::info!(%reason, "lease driver stopping");
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "lease driver could not tick");
                            term.clock.sleep(crate::limits::LEASE_DRIVER_RETRY).await;
                        }
                    }
                }
                deadline => {
                    let sleep = match deadline {
                        Some(deadline) => term.clock.sleep_until_ms(deadline),
                        None => Box::pin(std::future::pending()),
                    };
                    tokio::select! {
                        () = sleep => {}
                        _ = notified => {}
                        _ = stopping.changed() => {}
                        () = self.leadership_lost() => {}
                    }
                }
            }
        }
    }
}
