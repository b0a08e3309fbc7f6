//! A simulated client: the real client library, taking the one lock again and again and
//! running a read-modify-write of the fenced counter under it, now and then paused in the
//! middle as a process stopped by a garbage collector would be, and now and then handing the
//! lock on in one call (a release and the next acquire, `LockGuard::release_then_acquire`).
//! With [`crate::Options::modes`] it also takes the read-write lock, as a writer (the same
//! read-modify-write of its counter) or as a reader (a claim that reads, then a write the fence
//! must refuse), a permit of the semaphore (the read-modify-write of its slot's counter), and
//! the mutex and the read-write lock at once through one multi-lock (each lock's
//! read-modify-write with its own sequencer).

use std::time::Duration;

use palisade_client::{
    AcquireError, AcquireOptions, Client, ClientOptions, ErrorClass, LockPart, ReleaseError,
    Session, SessionOptions, Wait,
};
use palisade_core::{Access, Mode};
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom as _;
use rand::{RngExt as _, SeedableRng as _};

use crate::clock::DriftingClock;
use crate::record::{Outcome, Verdict, What};
use crate::{LOCK, POOL_LOCK, POOL_PERMITS, PORT, RW_LOCK, Shared, node_name, now};

/// The lease of every simulated session.
pub const TTL: Duration = Duration::from_secs(3);

/// How many more times a client sends an acquire or a release whose outcome the client library
/// reported unknown, with the same request id, as long as its session lives.
const UNKNOWN_RETRIES_MAX: u32 = 3;

/// What one client does.
pub(crate) struct Plan {
    pub(crate) client: usize,
    pub(crate) endpoints: Vec<String>,
    pub(crate) drift_ppm: i64,
    pub(crate) stop_at: Duration,
    /// The end of the safety phase: the client is paused, or its answers lost, only before
    /// it, so that after every fault is healed nothing keeps it from writing (the liveness
    /// check).
    pub(crate) faults_until: Duration,
    pub(crate) seed: u64,
    /// Whether it also takes the read-write lock and the semaphore.
    pub(crate) modes: bool,
}

/// Which locks one critical section takes, and how.
enum Section {
    /// One lock, in this mode.
    One(&'static str, Mode),
    /// These locks at once, each exclusive, through one multi-lock.
    All([&'static str; 2]),
}

/// Which locks one critical section takes, and how.
fn section(plan: &Plan, rng: &mut SmallRng) -> Section {
    if !plan.modes {
        return Section::One(LOCK, Mode::Exclusive);
    }
    // Half the sections take a permit: three clients must now and then all want one of the
    // two at once, or a semaphore admitting a third would go unseen.
    // Readers are as many as writers and the mutex's holders together, so that a phase often
    // comes while a writer is paused. One in nine takes the mutex and the read-write lock's
    // write side at once, named in either order.
    match rng.random_range(0..9) {
        0 => Section::One(LOCK, Mode::Exclusive),
        1 => Section::One(RW_LOCK, Mode::Exclusive),
        2 | 3 => Section::One(RW_LOCK, Mode::Shared),
        4 if rng.random_bool(0.5) => Section::All([LOCK, RW_LOCK]),
        4 => Section::All([RW_LOCK, LOCK]),
        _ => Section::One(POOL_LOCK, Mode::Permit(POOL_PERMITS)),
    }
}

pub(crate) async fn run(plan: Plan, world: Shared) -> turmoil::Result {
    let mut rng = SmallRng::seed_from_u64(plan.seed);
    let clock = DriftingClock::new(Duration::ZERO, plan.drift_ppm);
    world
        .borrow_mut()
        .client_clocks
        .insert(plan.client, clock.clone());
    let options = ClientOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(3),
        retry_budget: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let client = loop {
        if now() >= plan.stop_at {
            return Ok(());
        }
        match Client::connect_many_via(&plan.endpoints, options.clone(), Some(crate::net::dialer()))
            .await
        {
            Ok(client) => break client.with_clock(clock.shared()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    tokio::task::spawn_local(reader(
        plan.client,
        plan.stop_at,
        plan.seed ^ 0x7ead,
        world.clone(),
    ));
    while now() < plan.stop_at {
        if world.borrow().keys.is_none() {
            match client.public_keys().await {
                Ok(keys) => world.borrow_mut().keys = Some(keys),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let session = match client.open_session(SessionOptions::with_ttl(TTL)).await {
            Ok(session) => session,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let id = session.id().get();
        world.borrow_mut().record(What::SessionOpened {
            client: plan.client,
            session: id,
        });
        let ctx = Ctx {
            plan: &plan,
            world: &world,
            clock: &clock,
            client: &client,
            session: &session,
        };
        // A lock taken by a handoff from the one before: its critical section comes next.
        let mut handed = None;
        while now() < plan.stop_at && session.ended().is_none() {
            let (lock, guard) = match handed.take() {
                Some(held) => held,
                None => {
                    let (lock, mode) = match section(&plan, &mut rng) {
                        Section::One(lock, mode) => (lock, mode),
                        Section::All(locks) => {
                            let goes_on = multi_section(ctx, &mut rng, locks).await;
                            if !goes_on {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(rng.random_range(0..=100)))
                                .await;
                            continue;
                        }
                    };
                    let op = world.borrow_mut().record(What::AcquireInvoked {
                        client: plan.client,
                        session: id,
                        lock: lock.to_string(),
                        mode,
                        multi: None,
                    });
                    // Mostly short waits; now and then a patient one, which outlasts an
                    // election (a waiter queued at a leader that is then cut off must learn
                    // its outcome elsewhere).
                    let wait_ms = if rng.random_ratio(1, 4) {
                        rng.random_range(3_000..=8_000)
                    } else {
                        rng.random_range(500..=2_000)
                    };
                    let wait = Wait::For(Duration::from_millis(wait_ms));
                    // An outcome the client library could not learn within its retries is
                    // asked again with the same request id, as a real client does: the
                    // service answers with the first attempt's outcome instead of acquiring
                    // twice.
                    let request_id = palisade_client::request_id();
                    let acquired = until_known(&mut rng, &session, || {
                        let options = AcquireOptions {
                            mode,
                            ..AcquireOptions::wait(wait)
                        };
                        session.acquire_with_id(lock, options, request_id)
                    })
                    .await;
                    let guard = match acquired {
                        Ok(guard) => {
                            world.borrow_mut().record(What::AcquireCompleted {
                                op,
                                outcome: granted(&guard),
                            });
                            guard
                        }
                        Err(e) => {
                            let (outcome, goes_on) = not_granted(&e);
                            world
                                .borrow_mut()
                                .record(What::AcquireCompleted { op, outcome });
                            if !goes_on {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(rng.random_range(10..=200)))
                                .await;
                            continue;
                        }
                    };
                    (lock, guard)
                }
            };
            match hold(ctx, &mut rng, lock, guard).await {
                Next::Free => {}
                Next::Handed(lock, guard) => handed = Some((lock, guard)),
                Next::Stop => break,
            }
        }
        // The run's end (or the session's) came between a handoff and its critical section.
        if let Some((lock, guard)) = handed.take() {
            release(ctx, &mut rng, lock, guard).await;
        }
        let _ = session.close().await;
    }
    Ok(())
}

/// What each step of one client's session works with.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    plan: &'a Plan,
    world: &'a Shared,
    clock: &'a DriftingClock,
    client: &'a Client,
    session: &'a Session,
}

/// `attempt` (an acquire with a fixed request id), made again while the client library reports
/// its outcome unknown, up to [`UNKNOWN_RETRIES_MAX`] more times while the session lives.
async fn until_known<T, F>(
    rng: &mut SmallRng,
    session: &Session,
    mut attempt: impl FnMut() -> F,
) -> Result<T, AcquireError>
where
    F: std::future::Future<Output = Result<T, AcquireError>>,
{
    let mut retries = 0;
    loop {
        let result = attempt().await;
        match &result {
            Err(e)
                if e.outcome_unknown()
                    && retries < UNKNOWN_RETRIES_MAX
                    && session.ended().is_none() =>
            {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..=500))).await;
            }
            _ => return result,
        }
    }
}

/// What a session does after a critical section.
enum Next {
    /// Nothing held: the next section acquires.
    Free,
    /// A handoff took this lock: the next section runs under its guard.
    Handed(&'static str, palisade_client::LockGuard),
    /// A handoff failed other than by a refused acquire: the session stops, as after an
    /// acquire of unknown outcome (it may hold a lock it has no guard of; closing it releases
    /// everything).
    Stop,
}

/// The critical section under `guard` of `lock`, then its end: mostly a release, and one time
/// in four a handoff ([`palisade_client::LockGuard::release_then_acquire`]) to the lock the next
/// section takes (the same one again, behind its waiters, without `modes`). Not when that
/// section is a multi-lock (the draw is dropped), nor from a reader to a reader of the same
/// lock: the new grant may join the reader's phase with its token, and the history, which
/// tells grants apart by lock, session and token, would take it for the released one.
async fn hold(
    ctx: Ctx<'_>,
    rng: &mut SmallRng,
    lock: &'static str,
    guard: palisade_client::LockGuard,
) -> Next {
    let id = ctx.session.id().get();
    let gave_up = watch_lost(ctx.plan, ctx.world, id, lock, &guard);
    critical_section(ctx, rng, &guard).await;
    gave_up.abort();
    if rng.random_ratio(1, 4)
        && let Section::One(next, mode) = section(ctx.plan, rng)
        && !(next == lock && mode == Mode::Shared && guard.access() == Access::Shared)
    {
        return handoff(ctx, rng, (lock, guard), next, mode).await;
    }
    release(ctx, rng, lock, guard).await;
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..=100))).await;
    Next::Free
}

/// Gives `guard` of `lock` up and takes `next` in `mode` in one call, recorded as a release
/// and an acquire invoked together. A refused acquire (busy, the wait ended: the errors of
/// class `NotAcquired`, which the service answers only after the release took effect in the
/// same entry, `Table::release_then_acquire`) completes the release. Any other error is
/// recorded as of unknown outcome for both, conservatively (a refused release or an
/// unavailable service did nothing), and the session stops: unlike an acquire or a release,
/// the handoff is not sent again by the workload, whose guard is gone with the first attempt;
/// the client library resends lost answers with the same two request ids, and now and then
/// they are lost on purpose.
async fn handoff(
    ctx: Ctx<'_>,
    rng: &mut SmallRng,
    (lock, guard): (&'static str, palisade_client::LockGuard),
    next: &'static str,
    mode: Mode,
) -> Next {
    let Ctx {
        plan,
        world,
        session,
        ..
    } = ctx;
    let id = session.id().get();
    let (released, acquired) = {
        let mut world = world.borrow_mut();
        let released = world.record(What::ReleaseInvoked {
            client: plan.client,
            session: id,
            lock: lock.to_string(),
            token: guard.token().get(),
        });
        let acquired = world.record(What::AcquireInvoked {
            client: plan.client,
            session: id,
            lock: next.to_string(),
            mode,
            multi: None,
        });
        (released, acquired)
    };
    if rng.random_ratio(1, 10) && now() < plan.faults_until {
        lose_answers(plan, world, rng);
    }
    let wait = Wait::For(Duration::from_millis(rng.random_range(500..=2_000)));
    let options = AcquireOptions {
        mode,
        ..AcquireOptions::wait(wait)
    };
    let (release_outcome, acquire_outcome, then) =
        match guard.release_then_acquire(next, options).await {
            Ok(guard) => (
                Outcome::Released,
                granted(&guard),
                Next::Handed(next, guard),
            ),
            Err(e) if e.class() == ErrorClass::NotAcquired => (
                Outcome::Released,
                Outcome::Failed(e.to_string()),
                Next::Free,
            ),
            Err(e) => (
                Outcome::Unknown(e.to_string()),
                Outcome::Unknown(e.to_string()),
                Next::Stop,
            ),
        };
    {
        let mut world = world.borrow_mut();
        world.record(What::ReleaseCompleted {
            op: released,
            outcome: release_outcome,
        });
        world.record(What::AcquireCompleted {
            op: acquired,
            outcome: acquire_outcome,
        });
    }
    if matches!(then, Next::Free) {
        // As after any acquire that was refused.
        tokio::time::sleep(Duration::from_millis(rng.random_range(10..=200))).await;
    }
    then
}

/// A grant as the history records it.
fn granted(guard: &palisade_client::LockGuard) -> Outcome {
    Outcome::Granted {
        token: guard.token().get(),
        held: guard.access(),
    }
}

/// A critical section under two locks taken at once ([`Session::acquire_all`]): one acquire
/// recorded per lock, all with the multi-lock's request id (the history checker's check 10
/// judges them together), then each lock's read-modify-write of its own counter with its own
/// sequencer, then each lock's release. Whether the session may go on (`false` once its
/// outcome is unknown, the session lost, or a partial grant left it holding a lock it has no
/// guard of).
///
/// A multi-lock that fails with an internal error (the service, or the client library, found
/// the reply granting fewer locks than asked) may have granted some: the client then asks
/// which of the locks its session holds (a linearizable read), records those parts as
/// granted and the others as of unknown outcome, so that the checker sees a partial hold, and
/// ends the session (it holds a lock it has no guard of), which releases what it holds.
async fn multi_section(ctx: Ctx<'_>, rng: &mut SmallRng, locks: [&'static str; 2]) -> bool {
    let Ctx {
        plan,
        world,
        client,
        session,
        ..
    } = ctx;
    let id = session.id().get();
    let request_id = palisade_client::request_id();
    let ops = locks.map(|lock| {
        world.borrow_mut().record(What::AcquireInvoked {
            client: plan.client,
            session: id,
            lock: lock.to_string(),
            mode: Mode::Exclusive,
            multi: Some((request_id.get(), locks.len() as u32)),
        })
    });
    let wait = Wait::For(Duration::from_millis(rng.random_range(500..=2_000)));
    let parts = locks.map(LockPart::exclusive);
    let acquired = until_known(rng, session, || {
        session.acquire_all_with_id(&parts, wait, request_id)
    })
    .await;
    let guards = match acquired {
        Ok(guards) => guards,
        Err(e) if e.class() == ErrorClass::Internal => {
            for (op, lock) in ops.into_iter().zip(locks) {
                let outcome = match client.status(lock).await {
                    Ok(status) => match status.holder {
                        Some(holder) if holder.session.get() == id => Outcome::Granted {
                            token: holder.token.get(),
                            held: Access::Exclusive,
                        },
                        _ => Outcome::Unknown(e.to_string()),
                    },
                    Err(why) => Outcome::Unknown(why.to_string()),
                };
                let held = match outcome {
                    Outcome::Granted { token, .. } => Some(token),
                    _ => None,
                };
                let mut world = world.borrow_mut();
                world.record(What::AcquireCompleted { op, outcome });
                // The session's close, next, releases it: begun now, its outcome unknown.
                if let Some(token) = held {
                    world.record(What::ReleaseInvoked {
                        client: plan.client,
                        session: id,
                        lock: lock.to_string(),
                        token,
                    });
                }
            }
            return false;
        }
        Err(e) => {
            let (outcome, goes_on) = not_granted(&e);
            for op in ops {
                world.borrow_mut().record(What::AcquireCompleted {
                    op,
                    outcome: outcome.clone(),
                });
            }
            return goes_on;
        }
    };
    for (op, guard) in ops.into_iter().zip(&guards) {
        world.borrow_mut().record(What::AcquireCompleted {
            op,
            outcome: granted(guard),
        });
    }
    let watchers: Vec<_> = (locks.into_iter().zip(&guards))
        .map(|(lock, guard)| watch_lost(plan, world, id, lock, guard))
        .collect();
    for guard in &guards {
        critical_section(ctx, rng, guard).await;
    }
    for ((lock, guard), watcher) in locks.into_iter().zip(guards).zip(watchers) {
        watcher.abort();
        release(ctx, rng, lock, guard).await;
    }
    true
}

/// Records the release of `guard` as begun when the client library gives its lease up (it
/// could not prove it, its clock having run ahead): the holder has been told it lost the lock.
fn watch_lost(
    plan: &Plan,
    world: &Shared,
    session: u64,
    lock: &'static str,
    guard: &palisade_client::LockGuard,
) -> tokio::task::JoinHandle<()> {
    let token = guard.token().get();
    let world = world.clone();
    let lost = guard.lost();
    let client = plan.client;
    tokio::task::spawn_local(async move {
        lost.await;
        world.borrow_mut().record(What::ReleaseInvoked {
            client,
            session,
            lock: lock.to_string(),
            token,
        });
    })
}

/// Releases `guard` of `lock`, retrying an unknown outcome with the same request id, and
/// records it.
async fn release(
    ctx: Ctx<'_>,
    rng: &mut SmallRng,
    lock: &'static str,
    guard: palisade_client::LockGuard,
) {
    let Ctx {
        plan,
        world,
        client,
        session,
        ..
    } = ctx;
    let id = session.id().get();
    let token = guard.token().get();
    let op = world.borrow_mut().record(What::ReleaseInvoked {
        client: plan.client,
        session: id,
        lock: lock.to_string(),
        token,
    });
    // Now and then the answers to the release are lost, so that it is retried.
    let answers_lost = rng.random_ratio(1, 10) && now() < plan.faults_until;
    if answers_lost {
        lose_answers(plan, world, rng);
    }
    let credential = guard.session_credential();
    let request_id = palisade_client::request_id();
    let mut released = guard.release_with_id(request_id).await;
    let mut retries = 0;
    while released.as_ref().is_err_and(release_unknown)
        && retries < UNKNOWN_RETRIES_MAX
        && session.ended().is_none()
    {
        retries += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..=500))).await;
        released = client
            .release_with_id(credential, lock, request_id)
            .await
            .map(|_| ());
    }
    let outcome = match released {
        Ok(()) => Outcome::Released,
        // A session that ended between attempts may have ended after an attempt that
        // released.
        Err(e)
            if release_unknown(&e)
                || ((retries > 0 || answers_lost)
                    && matches!(e, ReleaseError::SessionNotFound { .. })) =>
        {
            Outcome::Unknown(e.to_string())
        }
        Err(e) => Outcome::Failed(e.to_string()),
    };
    world
        .borrow_mut()
        .record(What::ReleaseCompleted { op, outcome });
}

/// The answers of every node to this client are lost for 1 to 2.5 s, from now: the client's
/// next request is carried out, its answer never comes, and the client library retries it
/// after its request timeout, with the same request id.
fn lose_answers(plan: &Plan, world: &Shared, rng: &mut SmallRng) {
    let me = format!("c{}", plan.client);
    let nodes = plan.endpoints.len() as u64;
    for id in 1..=nodes {
        turmoil::partition_oneway(crate::node_name(id), me.as_str());
    }
    let lasts = Duration::from_millis(rng.random_range(1_000..=2_500));
    world
        .borrow_mut()
        .answers_lost
        .push((plan.client, now(), now() + lasts));
    tokio::task::spawn_local(async move {
        tokio::time::sleep(lasts).await;
        for id in 1..=nodes {
            turmoil::repair_oneway(crate::node_name(id), me.as_str());
        }
    });
}

/// How an acquire that failed with `e` ended, and whether its session may go on (not after an
/// unknown outcome, or once the session is gone). An acquire cut short by the loss of the
/// session may have been granted.
fn not_granted(e: &AcquireError) -> (Outcome, bool) {
    let unknown = e.outcome_unknown() || matches!(e, AcquireError::SessionLost { .. });
    let outcome = if unknown {
        Outcome::Unknown(e.to_string())
    } else {
        Outcome::Failed(e.to_string())
    };
    let goes_on = !unknown && !matches!(e, AcquireError::SessionNotFound { .. });
    (outcome, goes_on)
}

/// Whether a release may or may not have been applied.
fn release_unknown(e: &ReleaseError) -> bool {
    matches!(e.class(), ErrorClass::OutcomeUnknown | ErrorClass::Internal)
}

/// Reads the lock's state now and then, linearizably, from one member picked at random (which
/// answers, or names the leader and the client goes there), as `palisade status` given that
/// member first does. The other members follow it in the list: without TLS a client follows a
/// hint only to an endpoint it was given (N14).
async fn reader(client: usize, stop_at: Duration, seed: u64, world: Shared) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let options = ClientOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(1),
        retry_budget: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..=1_500))).await;
        if now() >= stop_at {
            return;
        }
        let members: Vec<u64> = world.borrow().members.iter().copied().collect();
        let Some(&id) = members.choose(&mut rng) else {
            continue;
        };
        let endpoints: Vec<String> = std::iter::once(id)
            .chain(members.iter().copied().filter(|&m| m != id))
            .map(|m| format!("http://{}:{PORT}", node_name(m)))
            .collect();
        let Ok(reader) =
            Client::connect_many_via(&endpoints, options.clone(), Some(crate::net::dialer())).await
        else {
            continue;
        };
        let op = world.borrow_mut().record(What::ReadInvoked {
            client,
            lock: LOCK.to_string(),
        });
        let outcome = match reader.status(LOCK).await {
            Ok(status) => Outcome::Status {
                holder: status.holder.map(|h| (h.session.get(), h.token.get())),
                last_token: status.last_token.get(),
            },
            Err(e) => Outcome::Failed(e.to_string()),
        };
        world
            .borrow_mut()
            .record(What::ReadCompleted { op, outcome });
    }
}

/// Claims the counter the grant guards with its sequencer, reads it, maybe pauses, and writes
/// it plus one. The resource refuses either step once a later holder has claimed it, and a
/// reader's write whatever its token. A writer's claim is a write's (it authorizes the write
/// that follows), a reader's a read's.
async fn critical_section(ctx: Ctx<'_>, rng: &mut SmallRng, guard: &palisade_client::LockGuard) {
    let Ctx {
        plan,
        world,
        clock,
        session,
        ..
    } = ctx;
    let keys = world
        .borrow()
        .keys
        .clone()
        .expect("fetched before any session");
    let session_id = session.id().get();
    let token = guard.token().get();
    let verified = palisade_sequencer::Sequencer::parse(guard.sequencer())
        .map_err(|e| e.to_string())
        .and_then(|s| s.verify(&keys).map_err(|e| e.to_string()));
    let sequencer = match verified {
        Ok(sequencer) => sequencer,
        Err(why) => {
            world.borrow_mut().record(What::Unverifiable {
                client: plan.client,
                token,
                why,
            });
            return;
        }
    };
    let access = sequencer.access();
    let scope = sequencer.binding().into_owned();
    // A slot beyond the semaphore's size (only a canary grants one) guards no counter: the
    // grant itself is what the checker reports.
    if counter(&world.borrow(), sequencer.lock(), access).is_none() {
        return;
    }
    let resource_event = |read: Option<u64>, wrote: Option<u64>, verdict: Verdict| What::Resource {
        client: plan.client,
        session: session_id,
        scope: scope.clone(),
        token,
        read,
        wrote,
        verdict,
    };
    believe(plan, world, clock, session, token);
    let read = {
        let mut world = world.borrow_mut();
        let resource = counter(&world, sequencer.lock(), access).expect("looked up above");
        let claimed = if access == Access::Shared {
            resource.claim(&sequencer, |value| *value)
        } else {
            resource.write(&sequencer, |value| *value)
        };
        world.record(resource_event(
            claimed.as_ref().ok().copied(),
            None,
            verdict(&claimed),
        ));
        match claimed {
            Ok(read) => {
                if access == Access::Shared {
                    let at = now();
                    world.last_write.insert(plan.client, at);
                }
                read
            }
            Err(_) => return,
        }
    };
    // A writer of the read-write lock pauses one time in three: a reader's phase may then come
    // between its claim and its write.
    let pauses = if access == Access::Exclusive && sequencer.lock() == RW_LOCK {
        3
    } else {
        6
    };
    if rng.random_ratio(1, pauses) && now() < plan.faults_until {
        // Paused: nothing of this client reaches the cluster, its keepalives included, for
        // longer than the lease may last; then it carries on as if nothing happened.
        let pause = Duration::from_millis(rng.random_range(1_000..=6_000));
        let me = format!("c{}", plan.client);
        for id in 1..=plan.endpoints.len() as u64 {
            turmoil::hold(me.as_str(), crate::node_name(id));
        }
        tokio::time::sleep(pause).await;
        for id in 1..=plan.endpoints.len() as u64 {
            turmoil::release(me.as_str(), crate::node_name(id));
        }
    } else {
        // A permit is held longer, so that the semaphore is now and then full.
        let held_ms = if matches!(access, Access::Slot(_)) {
            1_000
        } else {
            50
        };
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..=held_ms))).await;
    }
    believe(plan, world, clock, session, token);
    let mut world = world.borrow_mut();
    let resource = counter(&world, sequencer.lock(), access).expect("looked up above");
    let wrote = resource.write(&sequencer, |value| {
        *value = read + 1;
    });
    world.record(resource_event(Some(read), Some(read + 1), verdict(&wrote)));
    if wrote.is_ok() {
        let at = now();
        world.last_write.insert(plan.client, at);
    }
}

/// The counter a grant of `lock` held with `access` guards: the mutex's, the read-write
/// lock's, or its slot's.
fn counter<'w>(
    world: &'w crate::World,
    lock: &str,
    access: Access,
) -> Option<&'w palisade_fence::MemoryResource<u64>> {
    match access {
        Access::Slot(slot) => world.pool.get(usize::try_from(slot).ok()?),
        _ if lock == RW_LOCK => Some(&world.rw),
        _ => Some(&world.resource),
    }
}

fn verdict<T>(decided: &Result<T, palisade_fence::FenceError>) -> Verdict {
    match decided {
        Ok(_) => Verdict::Accepted,
        Err(palisade_fence::FenceError::SharedWrite { .. }) => Verdict::SharedWrite,
        Err(_) => Verdict::Refused,
    }
}

/// Records until when the client library says this session's lease is proven, in simulated
/// time.
fn believe(
    plan: &Plan,
    world: &Shared,
    clock: &DriftingClock,
    session: &palisade_client::Session,
    token: u64,
) {
    if let Some(remaining) = session.lease_remaining() {
        let until = now() + clock.to_simulated(remaining);
        world.borrow_mut().record(What::Belief {
            client: plan.client,
            session: session.id().get(),
            token,
            until,
        });
    }
}
