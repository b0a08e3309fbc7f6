//! The fence conformance suite: one contract, one list of scenarios, and every fence runs all of
//! them (enable the `testing` feature).
//!
//! A backend implements [`FenceHarness`] over one *resource*: one fenced scope and its data,
//! which the suite models as an integer `value` and a `log` of the tokens whose writes were
//! applied, in the order they were applied ([`Data`]). [`run_all`] then runs every scenario of
//! [`SCENARIOS`], each on a fresh resource from the caller's factory:
//!
//! - a newer holder supersedes an older one, and the refusal carries the presented and the
//!   accepted token and the holder's session;
//! - an equal token from another session is [`FenceError::TokenReissued`];
//! - a foreign lock is [`FenceError::WrongLock`]; a bad signature, a sequencer of another key and
//!   an edited token are [`FenceError::Forged`]; none of them changes anything;
//! - a write that is rolled back takes the token advance with it;
//! - a claim before the read refuses the superseded holder's write back, and a read without a
//!   claim loses an update (what the fence does not protect, as the crate docs say);
//! - the accepted token, its lock and its holder session survive a reopen;
//! - racing writers are applied in token order and the highest wins; racing claimers doing a
//!   read-modify-write lose no increment (real threads, bounded loops);
//! - readers of one shared phase all claim; a reader's write is [`FenceError::SharedWrite`] and
//!   changes nothing; a reader of an earlier phase is stale once a writer wrote;
//! - a scope bound to a semaphore's slot refuses another slot's permit (whatever its token, which
//!   does not advance the scope) and a superseded holder of its own slot.
//!
//! A step a backend cannot take returns [`Unsupported`] with the reason, and the scenario that
//! needs it says so on stderr and passes (an in-memory resource has nothing to reopen). A harness
//! panics on anything that is not the fence's answer (a lost connection, a missing table): the
//! suite is a test.
//!
//! # Run it for your own fence
//!
//! Implement [`FenceHarness`] for a handle on your resource ([`MemoryHarness`] is the shortest
//! one: read its source as a template), then run the suite from a test of your own crate, with
//! `palisade-fence = { version = "…", features = ["testing"] }` among its dev-dependencies:
//!
//! ```no_run
//! use palisade_fence::testing::{self, MemoryHarness};
//!
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! async fn my_fence_passes_the_fence_conformance_suite() {
//!     // A factory: each scenario gets a fresh resource (for a server, a fresh scope and
//!     // tables), and the suite calls `connect_another` for each racer.
//!     testing::run_all(MemoryHarness::fresh).await;
//! }
//! ```
//!
//! Sequencers come from [`grant`], signed by [`service_key`]; a resource that verifies sequencer
//! text itself (an HTTP service) trusts [`public_keys`] and overrides
//! [`FenceHarness::write_presented`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use palisade_core::{Access, SessionId, Token};
use palisade_sequencer::{KeySet, PublicKey, SigningKey, VerifiedSequencer};

use crate::{FenceError, FenceState, MemoryResource, verify_presented};

/// The data of a fenced resource under test: a value and the log of applied tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Data {
    /// The value the last applied write left (0 before any write).
    pub value: i64,
    /// The token of every applied write, in the order they were applied.
    pub log: Vec<u64>,
}

impl Data {
    /// Applies one accepted write of `value` by `sequencer`, and returns `value`: what
    /// [`FenceHarness::write`] and [`FenceHarness::increment`] do inside the fence's atomic step.
    pub fn apply(&mut self, sequencer: &VerifiedSequencer, value: i64) -> i64 {
        self.value = value;
        self.log.push(sequencer.token().get());
        value
    }
}

/// A step a backend cannot take, and why (the scenario needing it is skipped, saying so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsupported(pub &'static str);

/// One fenced resource (a scope and its [`Data`]) seen through one handle: a connection, an
/// open file, a client. Every fenced step checks the sequencer and applies its effect in one
/// atomic step, as the backend's users do.
///
/// The futures are `Send` because the racing scenarios run handles on several threads.
pub trait FenceHarness: Send + Sync + Sized + 'static {
    /// Another handle on the same resource, with a connection of its own: another process.
    fn connect_another(&self) -> impl Future<Output = Self> + Send;

    /// Claims the scope for `sequencer` (advances its accepted token) and writes nothing: the
    /// step a holder takes before it reads, with [`crate::Intent::Read`], so a shared grant (a
    /// reader) may take it.
    fn claim(
        &self,
        sequencer: &VerifiedSequencer,
    ) -> impl Future<Output = Result<(), FenceError>> + Send;

    /// A fenced write: sets the value to `value` and appends the sequencer's token to the log,
    /// atomically with the check and the advance ([`crate::Intent::Write`]: a shared grant is
    /// refused).
    fn write(
        &self,
        sequencer: &VerifiedSequencer,
        value: i64,
    ) -> impl Future<Output = Result<(), FenceError>> + Send;

    /// A fenced read-modify-write in one atomic step: claims, reads the value, writes it plus
    /// one and appends the token to the log. Returns the new value.
    fn increment(
        &self,
        sequencer: &VerifiedSequencer,
    ) -> impl Future<Output = Result<i64, FenceError>> + Send;

    /// Claims with `sequencer`, writes `value` as [`FenceHarness::write`] does, and then rolls
    /// the whole step back (a transaction rolled back, a request that fails after the check).
    /// Returns what the claim answered.
    fn write_and_roll_back(
        &self,
        sequencer: &VerifiedSequencer,
        value: i64,
    ) -> impl Future<Output = Result<Result<(), FenceError>, Unsupported>> + Send;

    /// Closes this handle and opens the resource again (reopens the file, reconnects), as a
    /// restarted process would.
    fn reopen(&mut self) -> impl Future<Output = Result<(), Unsupported>> + Send;

    /// The data as stored, read without a sequencer (an unfenced read).
    fn read(&self) -> impl Future<Output = Data> + Send;

    /// The scope's stored fence state: accepted token, lock and holder session.
    fn state(&self) -> impl Future<Output = Option<FenceState>> + Send;

    /// [`FenceHarness::write`] with sequencer text as a client presents it, verified against
    /// `keys`. Override it where the resource verifies the text itself (an HTTP header).
    fn write_presented(
        &self,
        presented: &str,
        keys: &KeySet,
        value: i64,
    ) -> impl Future<Output = Result<(), FenceError>> + Send {
        async move {
            let sequencer = verify_presented(Some(presented), keys)?;
            self.write(&sequencer, value).await
        }
    }

    /// Removes what the resource left on a shared server (tables, keys); called once a scenario
    /// passed.
    fn clean_up(self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The harness of [`MemoryResource`]: every handle shares one resource in this process, so it
/// has nothing to reopen and nothing to roll back.
#[derive(Debug)]
pub struct MemoryHarness(Arc<MemoryResource<Data>>);

impl MemoryHarness {
    /// A fresh resource, bound to the lock of its first writer.
    pub async fn fresh() -> MemoryHarness {
        MemoryHarness(Arc::new(MemoryResource::new(Data::default())))
    }
}

impl FenceHarness for MemoryHarness {
    async fn connect_another(&self) -> Self {
        MemoryHarness(Arc::clone(&self.0))
    }

    async fn claim(&self, sequencer: &VerifiedSequencer) -> Result<(), FenceError> {
        self.0.claim(sequencer, |_| ())
    }

    async fn write(&self, sequencer: &VerifiedSequencer, value: i64) -> Result<(), FenceError> {
        self.0
            .write(sequencer, |data| data.apply(sequencer, value))
            .map(drop)
    }

    async fn increment(&self, sequencer: &VerifiedSequencer) -> Result<i64, FenceError> {
        self.0
            .write(sequencer, |data| data.apply(sequencer, data.value + 1))
    }

    async fn write_and_roll_back(
        &self,
        _: &VerifiedSequencer,
        _: i64,
    ) -> Result<Result<(), FenceError>, Unsupported> {
        Err(Unsupported(
            "a MemoryResource applies every accepted write, it has no transaction to roll back",
        ))
    }

    async fn reopen(&mut self) -> Result<(), Unsupported> {
        Err(Unsupported(
            "a MemoryResource lives in the process's memory, it is not durable",
        ))
    }

    async fn read(&self) -> Data {
        self.0.read(Data::clone).expect("no write panicked")
    }

    async fn state(&self) -> Option<FenceState> {
        self.0.fence_state().expect("no write panicked")
    }
}

/// The lock service whose grants the suite presents.
pub fn service_key() -> SigningKey {
    SigningKey::from_bytes([42; 32])
}

/// The public key of [`service_key`].
pub fn public_key() -> PublicKey {
    service_key().public_key()
}

/// The keys a resource under test trusts: [`service_key`]'s only.
pub fn public_keys() -> KeySet {
    public_key().into()
}

/// A grant of `lock` with `token` to `session`, signed by [`service_key`] and verified.
pub fn grant(lock: &str, token: u64, session: u64) -> VerifiedSequencer {
    let sequencer = service_key()
        .sign(lock, Token::new(token), SessionId::new(session))
        .expect("the suite signs valid grants");
    public_key()
        .verify(sequencer.as_str())
        .expect("a grant signed by the service verifies")
}

/// A shared grant (a reader of the shared phase of `token`) of `lock` to `session`, signed by
/// [`service_key`] and verified.
pub fn shared_grant(lock: &str, token: u64, session: u64) -> VerifiedSequencer {
    grant_with(lock, Access::Shared, token, session)
}

/// The permit in slot `slot` of semaphore `lock`, with `token`, to `session`, signed by
/// [`service_key`] and verified.
pub fn permit(lock: &str, slot: u32, token: u64, session: u64) -> VerifiedSequencer {
    grant_with(lock, Access::Slot(slot), token, session)
}

fn grant_with(lock: &str, access: Access, token: u64, session: u64) -> VerifiedSequencer {
    let sequencer = service_key()
        .sign_access(lock, access, Token::new(token), SessionId::new(session))
        .expect("the suite signs valid grants");
    public_key()
        .verify(sequencer.as_str())
        .expect("a grant signed by the service verifies")
}

/// The refusal of `presented` where the scope accepted `accepted`, set by session `holder`.
pub fn stale(lock: &str, presented: u64, accepted: u64, holder: u64) -> FenceError {
    FenceError::Stale {
        lock: lock.into(),
        presented: Token::new(presented),
        accepted: Token::new(accepted),
        holder_session: Some(SessionId::new(holder)),
    }
}

/// The refusal of token `token` presented by session `presented` where session `first`
/// presented it first: the lock service issued that token twice.
pub fn reissued(lock: &str, token: u64, first: u64, presented: u64) -> FenceError {
    FenceError::TokenReissued {
        lock: lock.into(),
        token: Token::new(token),
        first_session: SessionId::new(first),
        presented_session: SessionId::new(presented),
    }
}

/// A sequencer for `token` signed by another key but naming [`service_key`]'s key id: only the
/// signature check can refuse it.
pub fn forged_text(lock: &str, token: u64) -> String {
    let attacker = SigningKey::from_bytes([13; 32]);
    attacker
        .sign(lock, Token::new(token), SessionId::new(666))
        .expect("a valid grant")
        .to_string()
        .replacen(
            &attacker.key_id().to_string(),
            &service_key().key_id().to_string(),
            1,
        )
}

/// A sequencer signed by a key the resource does not trust, naming that key.
pub fn foreign_key_text(lock: &str, token: u64) -> String {
    SigningKey::from_bytes([7; 32])
        .sign(lock, Token::new(token), SessionId::new(667))
        .expect("a valid grant")
        .to_string()
}

/// A grant of the service whose token was edited after signing, from `token` to `edited`.
pub fn edited_token_text(lock: &str, token: u64, edited: u64, session: u64) -> String {
    let text = service_key()
        .sign(lock, Token::new(token), SessionId::new(session))
        .expect("a valid grant")
        .to_string();
    let field = format!(".{token}.{session}.");
    assert!(text.contains(&field), "sequencer layout changed: {text}");
    text.replacen(&field, &format!(".{edited}.{session}."), 1)
}

/// A deterministic shuffle (xorshift), so a failing race replays with the same tokens.
pub fn shuffled(mut items: Vec<u64>, seed: u64) -> Vec<u64> {
    let mut state = seed | 1;
    for index in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(index, (state % (index as u64 + 1)) as usize);
    }
    items
}

/// Asserts the tokens, in the order their writes were applied, never go down.
pub fn assert_nondecreasing(applied: &[u64]) {
    for pair in applied.windows(2) {
        assert!(
            pair[0] <= pair[1],
            "token {} applied after token {}",
            pair[1],
            pair[0]
        );
    }
}

/// Says loudly that a test or a step did not run: written to the real stderr, past the test
/// harness's output capture, so it shows in every `cargo test` run.
pub fn skip(message: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{message}");
}

/// A scenario's future.
pub type ScenarioFuture<H> = Pin<Box<dyn Future<Output = Option<H>> + Send>>;

/// One scenario: a name and its body, which takes a fresh resource and returns it to be cleaned
/// up (or `None` if it was consumed).
pub struct Scenario<H> {
    pub name: &'static str,
    pub run: fn(H) -> ScenarioFuture<H>,
}

impl<H> std::fmt::Debug for Scenario<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        /// Every scenario of the suite, in the order [`run_all`] runs them.
        pub fn scenarios<H: FenceHarness>() -> Vec<Scenario<H>> {
            vec![$(Scenario {
                name: stringify!($name),
                run: |harness| Box::pin($name(harness)),
            }),*]
        }

        /// The names of [`scenarios`], for documentation and reports.
        pub const SCENARIOS: &[&str] = &[$(stringify!($name)),*];
    };
}

scenarios!(
    a_newer_holder_supersedes_and_the_old_token_is_refused,
    an_equal_token_from_another_session_is_refused_as_reissued,
    a_foreign_lock_is_refused_and_changes_nothing,
    forgeries_are_refused_and_change_nothing,
    a_rolled_back_write_leaves_neither_data_nor_token_advance,
    a_claim_before_the_read_refuses_the_superseded_write_back,
    a_read_without_a_claim_loses_an_update,
    the_fence_state_and_data_survive_a_reopen,
    racing_writers_apply_in_token_order_and_the_highest_wins,
    racing_claimers_lose_no_increment,
    readers_of_one_phase_all_claim,
    a_readers_write_is_refused_and_changes_nothing,
    a_reader_of_an_earlier_phase_is_stale_after_a_writer_wrote,
    a_slot_scope_refuses_another_slots_permit_and_keeps_its_own_maximum,
    a_superseded_slot_holder_is_refused,
);

/// Runs every scenario, each on a fresh resource from `fresh`, and panics naming the first that
/// fails. Run it on a multi-thread runtime: the racing scenarios run on several threads.
pub async fn run_all<H, F, Fut>(fresh: F)
where
    H: FenceHarness,
    F: Fn() -> Fut,
    Fut: Future<Output = H>,
{
    assert_eq!(
        tokio::runtime::Handle::current().runtime_flavor(),
        tokio::runtime::RuntimeFlavor::MultiThread,
        "the fence conformance suite races handles on several threads: run it in \
         #[tokio::test(flavor = \"multi_thread\", worker_threads = 2)]"
    );
    for scenario in scenarios::<H>() {
        let harness = fresh().await;
        // Its own task, so a failure is reported with the scenario's name.
        match tokio::spawn((scenario.run)(harness)).await {
            Ok(Some(harness)) => harness.clean_up().await,
            Ok(None) => {}
            Err(failure) => match failure.try_into_panic() {
                Ok(panic) => {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
                        .unwrap_or_default();
                    panic!(
                        "fence conformance scenario {} failed: {message}",
                        scenario.name
                    )
                }
                Err(failure) => panic!(
                    "fence conformance scenario {} did not finish: {failure}",
                    scenario.name
                ),
            },
        }
    }
}

fn state_of(lock: &str, token: u64, session: u64) -> Option<FenceState> {
    Some(FenceState {
        lock: lock.into(),
        token_max: Token::new(token),
        holder_session: SessionId::new(session),
    })
}

fn data(value: i64, log: &[u64]) -> Data {
    Data {
        value,
        log: log.to_vec(),
    }
}

/// Asserts what the resource stores: its fence state and its data.
async fn assert_stored<H: FenceHarness>(fence: &H, state: Option<FenceState>, data: Data) {
    assert_eq!(fence.state().await, state, "the fence state");
    assert_eq!(fence.read().await, data, "the data");
}

/// Asserts `sequencer` is refused with `expected`, a final refusal, both to write and to claim.
async fn assert_refused<H: FenceHarness>(
    fence: &H,
    sequencer: &VerifiedSequencer,
    expected: FenceError,
) {
    let refused = fence.write(sequencer, 666).await.unwrap_err();
    assert_eq!(refused, expected, "the write of {sequencer:?}");
    assert!(refused.is_final(), "{refused:?}");
    assert_eq!(
        fence.claim(sequencer).await,
        Err(expected),
        "the claim of {sequencer:?}"
    );
}

/// A fresh resource accepts its first holder; a newer holder's write supersedes it; the older
/// holder's write is then refused with the presented and accepted tokens and the holder's
/// session, and changes nothing; the holder of the accepted token writes again.
pub async fn a_newer_holder_supersedes_and_the_old_token_is_refused<H: FenceHarness>(
    fence: H,
) -> Option<H> {
    assert_stored(&fence, None, Data::default()).await;
    fence.write(&grant("report", 3, 1), 30).await.unwrap();
    assert_eq!(fence.state().await, state_of("report", 3, 1));
    fence.write(&grant("report", 8, 2), 80).await.unwrap();
    assert_eq!(fence.state().await, state_of("report", 8, 2));

    // The first holder, paused past its lease, wakes and writes or claims; so does a holder
    // granted between the two.
    for (token, session) in [(3, 1), (7, 3)] {
        let late = grant("report", token, session);
        assert_refused(&fence, &late, stale("report", token, 8, 2)).await;
    }
    assert_stored(&fence, state_of("report", 8, 2), data(80, &[3, 8])).await;

    // One grant may write many times.
    fence.write(&grant("report", 8, 2), 81).await.unwrap();
    assert_eq!(fence.read().await.value, 81);
    assert_eq!(fence.state().await, state_of("report", 8, 2));
    Some(fence)
}

/// The accepted token presented again by another session (the lock service issued it twice)
/// is refused and changes nothing; the session that presented it first writes on. Sessions above
/// `i64::MAX` compare as themselves.
pub async fn an_equal_token_from_another_session_is_refused_as_reissued<H: FenceHarness>(
    fence: H,
) -> Option<H> {
    let (first, second) = (u64::MAX - 1, 7);
    fence.write(&grant("report", 5, first), 50).await.unwrap();
    for presented in [second, u64::MAX] {
        let twice = grant("report", 5, presented);
        assert_refused(&fence, &twice, reissued("report", 5, first, presented)).await;
    }
    assert_stored(&fence, state_of("report", 5, first), data(50, &[5])).await;

    fence.write(&grant("report", 5, first), 52).await.unwrap();
    assert_eq!(fence.state().await, state_of("report", 5, first));
    fence.write(&grant("report", 6, second), 60).await.unwrap();
    assert_eq!(fence.state().await, state_of("report", 6, second));
    Some(fence)
}

/// The first write binds the scope to its lock: a sequencer of another lock, even with a much
/// higher token, is refused with both lock names and changes nothing.
pub async fn a_foreign_lock_is_refused_and_changes_nothing<H: FenceHarness>(fence: H) -> Option<H> {
    fence.write(&grant("report", 5, 1), 50).await.unwrap();
    let wrong_lock = FenceError::WrongLock {
        expected: "report".into(),
        presented: "other".into(),
    };
    assert_refused(&fence, &grant("other", 1000, 9), wrong_lock).await;
    assert_stored(&fence, state_of("report", 5, 1), data(50, &[5])).await;
    fence.write(&grant("report", 6, 2), 60).await.unwrap();
    assert_eq!(fence.read().await.value, 60);
    Some(fence)
}

/// A sequencer with a bad signature, one signed by a key the resource does not trust, and a
/// genuine one whose token was edited are refused as forged; none locks the honest writers out.
pub async fn forgeries_are_refused_and_change_nothing<H: FenceHarness>(fence: H) -> Option<H> {
    let keys = public_keys();
    let honest = service_key()
        .sign("report", Token::new(5), SessionId::new(1))
        .unwrap()
        .to_string();
    fence.write_presented(&honest, &keys, 50).await.unwrap();
    let huge = 1 << 62;
    for forged in [
        forged_text("report", huge),
        foreign_key_text("report", huge),
        edited_token_text("report", 5, huge, 1),
    ] {
        let refused = fence
            .write_presented(&forged, &keys, 666)
            .await
            .unwrap_err();
        assert_eq!(refused.kind(), "forged", "{forged}: {refused:?}");
        assert!(refused.is_final(), "{refused:?}");
    }
    assert_stored(&fence, state_of("report", 5, 1), data(50, &[5])).await;
    // The honest next holder still writes.
    fence.write(&grant("report", 6, 2), 60).await.unwrap();
    assert_eq!(fence.state().await, state_of("report", 6, 2));
    Some(fence)
}

/// A write whose step is rolled back after the claim leaves the data and the accepted token as
/// they were, on a fresh scope (no state at all, not bound to the lock) as on a used one: the
/// next token is still accepted.
pub async fn a_rolled_back_write_leaves_neither_data_nor_token_advance<H: FenceHarness>(
    fence: H,
) -> Option<H> {
    match fence.write_and_roll_back(&grant("other", 9, 2), 90).await {
        Err(Unsupported(why)) => {
            skip(&format!("skipping: rolled-back write: {why}"));
            return Some(fence);
        }
        Ok(claimed) => claimed.unwrap(),
    }
    assert_stored(&fence, None, Data::default()).await;
    fence.write(&grant("report", 2, 1), 20).await.unwrap();
    fence
        .write_and_roll_back(&grant("report", 50, 2), 500)
        .await
        .expect("supported once")
        .unwrap();
    assert_stored(&fence, state_of("report", 2, 1), data(20, &[2])).await;
    fence.write(&grant("report", 3, 3), 30).await.unwrap();
    assert_eq!(fence.state().await, state_of("report", 3, 3));
    Some(fence)
}

/// Holder A (token 10) claims and reads, B (token 11) claims and reads, A writes back its
/// increment, B writes back its own. Returns the final value and what A's write came to.
async fn two_increments<H: FenceHarness>(
    fence: &H,
    claim_reads: bool,
) -> (i64, Result<(), FenceError>) {
    fence.write(&grant("counter", 1, 9), 5).await.unwrap();
    let (a, b) = (grant("counter", 10, 1), grant("counter", 11, 2));
    if claim_reads {
        fence.claim(&a).await.unwrap();
    }
    let seen_by_a = fence.read().await.value;
    // A pauses past its lease here; B is granted the lock.
    if claim_reads {
        fence.claim(&b).await.unwrap();
    }
    let seen_by_b = fence.read().await.value;
    let written_by_a = fence.write(&a, seen_by_a + 1).await;
    fence.write(&b, seen_by_b + 1).await.unwrap();
    (fence.read().await.value, written_by_a)
}

/// Holders claim before they read: the superseded holder's write back, computed from what it
/// read, is refused, and only the current holder's increment lands.
pub async fn a_claim_before_the_read_refuses_the_superseded_write_back<H: FenceHarness>(
    fence: H,
) -> Option<H> {
    let (value, written_by_a) = two_increments(&fence, true).await;
    assert_eq!(
        written_by_a.unwrap_err(),
        stale("counter", 10, 11, 2),
        "B claimed before reading, so A's write back is refused"
    );
    assert_eq!(value, 6, "only B's increment, made from what B read");
    Some(fence)
}

/// What the fence does not protect: holders that read without claiming both read 5, A's write
/// is accepted (no newer grant had claimed yet), and one increment is lost.
pub async fn a_read_without_a_claim_loses_an_update<H: FenceHarness>(fence: H) -> Option<H> {
    let (value, written_by_a) = two_increments(&fence, false).await;
    assert_eq!(written_by_a, Ok(()), "no newer grant had claimed yet");
    assert_eq!(value, 6, "two increments of 5, and one was lost");
    Some(fence)
}

/// After a reopen (a restarted process, a new connection) the accepted token, its lock and its
/// holder session are as they were, with the data: the superseded token, a reissued one and a
/// foreign lock are still refused, and the holder writes on.
pub async fn the_fence_state_and_data_survive_a_reopen<H: FenceHarness>(mut fence: H) -> Option<H> {
    fence.write(&grant("report", 4, 1), 40).await.unwrap();
    fence.write(&grant("report", 7, 2), 70).await.unwrap();
    if let Err(Unsupported(why)) = fence.reopen().await {
        skip(&format!("skipping: reopen: {why}"));
        return Some(fence);
    }
    assert_stored(&fence, state_of("report", 7, 2), data(70, &[4, 7])).await;
    let wrong_lock = FenceError::WrongLock {
        expected: "report".into(),
        presented: "other".into(),
    };
    for (refused, why) in [
        (grant("report", 4, 1), stale("report", 4, 7, 2)),
        (grant("report", 7, 3), reissued("report", 7, 2, 3)),
        (grant("other", 9, 3), wrong_lock),
    ] {
        assert_refused(&fence, &refused, why).await;
    }
    assert_stored(&fence, state_of("report", 7, 2), data(70, &[4, 7])).await;
    fence.write(&grant("report", 7, 2), 72).await.unwrap();
    assert_eq!(fence.read().await.value, 72);
    Some(fence)
}

/// Splits `tokens` round-robin into `racers` shares.
fn shares(tokens: &[u64], racers: usize) -> Vec<Vec<u64>> {
    (0..racers)
        .map(|racer| tokens.iter().copied().skip(racer).step_by(racers).collect())
        .collect()
}

/// Asserts a refusal in a race is the stale refusal of `token` by a higher accepted token.
fn assert_superseded(refused: FenceError, token: u64) {
    match refused {
        FenceError::Stale {
            presented,
            accepted,
            ..
        } => assert!(
            presented == Token::new(token) && accepted > presented,
            "token {token} refused by accepted {accepted}"
        ),
        other => panic!("token {token}: unexpected refusal {other}"),
    }
}

/// Writers with their own connections present shuffled tokens on a fresh scope (the first
/// writes race too): the applied tokens never go down, every token is applied or refused as
/// stale, and the highest token's write is the final value.
pub async fn racing_writers_apply_in_token_order_and_the_highest_wins<H: FenceHarness>(
    fence: H,
) -> Option<H> {
    const WRITERS: usize = 4;
    const TOKENS: u64 = 80;
    let tokens = shuffled((1..=TOKENS).collect(), 0x5eed);
    let mut racers = Vec::new();
    for (writer, mine) in shares(&tokens, WRITERS).into_iter().enumerate() {
        let handle = fence.connect_another().await;
        racers.push(tokio::spawn(async move {
            let mut refused = 0;
            for token in mine {
                let sequencer = grant("race", token, writer as u64 + 1);
                match handle.write(&sequencer, token as i64).await {
                    Ok(()) => {}
                    Err(error) => {
                        assert_superseded(error, token);
                        refused += 1;
                    }
                }
            }
            refused
        }));
    }
    let mut refused = 0;
    for racer in racers {
        refused += racer.await.expect("a writer panicked");
    }
    let data = fence.read().await;
    assert_nondecreasing(&data.log);
    assert_eq!(data.log.len() + refused, TOKENS as usize);
    assert_eq!(data.log.last(), Some(&TOKENS));
    assert_eq!(data.value, TOKENS as i64, "the highest token's write wins");
    assert_eq!(
        fence.state().await.map(|state| state.token_max),
        Some(Token::new(TOKENS))
    );
    Some(fence)
}

/// Claimers with their own connections each read-modify-write the value in one fenced step,
/// with shuffled tokens: every accepted increment counts, in token order, and each learned a
/// value no other increment returned.
pub async fn racing_claimers_lose_no_increment<H: FenceHarness>(fence: H) -> Option<H> {
    const CLAIMERS: usize = 4;
    const TOKENS: u64 = 60;
    let tokens = shuffled((1..=TOKENS).collect(), 7);
    let mut racers = Vec::new();
    for (claimer, mine) in shares(&tokens, CLAIMERS).into_iter().enumerate() {
        let handle = fence.connect_another().await;
        racers.push(tokio::spawn(async move {
            let mut values = Vec::new();
            for token in mine {
                match handle
                    .increment(&grant("c", token, claimer as u64 + 1))
                    .await
                {
                    Ok(value) => values.push(value),
                    Err(error) => assert_superseded(error, token),
                }
            }
            values
        }));
    }
    let mut values = Vec::new();
    for racer in racers {
        values.extend(racer.await.expect("a claimer panicked"));
    }
    values.sort_unstable();
    let counted: Vec<i64> = (1..=values.len() as i64).collect();
    assert_eq!(values, counted, "each increment returned its own value");
    let data = fence.read().await;
    assert_eq!(
        data.value,
        counted.len() as i64,
        "every accepted increment counted"
    );
    assert_eq!(data.log.len(), counted.len());
    assert_nondecreasing(&data.log);
    assert_eq!(data.log.last(), Some(&TOKENS));
    Some(fence)
}

const READERS: &str = "reports";

/// Readers of one shared phase (one token, several sessions) all claim, each again too; the
/// scope stores holder 0 for the phase, and an exclusive grant presenting the phase's token is
/// refused as issued twice.
pub async fn readers_of_one_phase_all_claim<H: FenceHarness>(fence: H) -> Option<H> {
    fence.write(&grant(READERS, 5, 1), 50).await.unwrap();
    let (first, second) = (shared_grant(READERS, 6, 2), shared_grant(READERS, 6, 3));
    fence.claim(&first).await.unwrap();
    fence.claim(&second).await.unwrap();
    fence.claim(&first).await.unwrap();
    assert_eq!(fence.state().await, state_of(READERS, 6, 0));
    assert_eq!(
        fence.write(&grant(READERS, 6, 4), 60).await,
        Err(reissued(READERS, 6, 0, 4))
    );
    assert_stored(&fence, state_of(READERS, 6, 0), data(50, &[5])).await;
    Some(fence)
}

/// A reader's write is [`FenceError::SharedWrite`], whether or not its phase claimed, and
/// changes neither the data nor the fence state.
pub async fn a_readers_write_is_refused_and_changes_nothing<H: FenceHarness>(
    fence: H,
) -> Option<H> {
    let refused = fence.write(&shared_grant(READERS, 4, 2), 40).await;
    assert!(
        matches!(&refused, Err(FenceError::SharedWrite { lock, token }) if lock == READERS && token.get() == 4),
        "{refused:?}"
    );
    assert_eq!(fence.state().await, None, "a refused write binds nothing");
    fence.write(&grant(READERS, 5, 1), 50).await.unwrap();
    let reader = shared_grant(READERS, 6, 2);
    fence.claim(&reader).await.unwrap();
    let refused = fence.write(&reader, 60).await.unwrap_err();
    assert!(
        refused.is_shared_write() && refused.is_final(),
        "{refused:?}"
    );
    assert_stored(&fence, state_of(READERS, 6, 0), data(50, &[5])).await;
    Some(fence)
}

/// A writer after a shared phase writes, and then a reader of that phase (or of an earlier one)
/// is refused as stale, naming the writer's session: a reader paused past its lease reads
/// nothing the writer may have changed.
pub async fn a_reader_of_an_earlier_phase_is_stale_after_a_writer_wrote<H: FenceHarness>(
    fence: H,
) -> Option<H> {
    let reader = shared_grant(READERS, 6, 2);
    fence.claim(&reader).await.unwrap();
    fence.claim(&shared_grant(READERS, 6, 3)).await.unwrap();
    fence.write(&grant(READERS, 7, 4), 70).await.unwrap();
    assert_eq!(fence.claim(&reader).await, Err(stale(READERS, 6, 7, 4)));
    assert_eq!(
        fence.claim(&shared_grant(READERS, 3, 5)).await,
        Err(stale(READERS, 3, 7, 4))
    );
    // A later phase claims after the writer.
    fence.claim(&shared_grant(READERS, 8, 5)).await.unwrap();
    assert_stored(&fence, state_of(READERS, 8, 0), data(70, &[7])).await;
    Some(fence)
}

const SHARDS: &str = "shards";

/// A scope bound to slot 0 of a semaphore refuses the permit of slot 1 as another binding, even
/// with a higher token, and that token does not advance it: slot 0's holder writes on. Each
/// slot keeps its own maximum.
pub async fn a_slot_scope_refuses_another_slots_permit_and_keeps_its_own_maximum<
    H: FenceHarness,
>(
    fence: H,
) -> Option<H> {
    let slot0 = permit(SHARDS, 0, 5, 1);
    fence.write(&slot0, 50).await.unwrap();
    let slot0_binding = palisade_sequencer::binding(SHARDS, Access::Slot(0)).into_owned();
    assert_eq!(fence.state().await, state_of(&slot0_binding, 5, 1));
    let expected_wrong = FenceError::WrongLock {
        expected: "shards (slot 0)".into(),
        presented: "shards (slot 1)".into(),
    };
    assert_refused(&fence, &permit(SHARDS, 1, 9, 2), expected_wrong).await;
    let refused = fence.write(&grant(SHARDS, 9, 3), 90).await.unwrap_err();
    assert!(refused.is_wrong_lock(), "{refused:?}");
    fence.write(&slot0, 51).await.unwrap();
    assert_stored(&fence, state_of(&slot0_binding, 5, 1), data(51, &[5, 5])).await;
    Some(fence)
}

/// The slot's next holder writes; the superseded holder of the same slot is then refused as
/// stale, with the slot named, and changes nothing.
pub async fn a_superseded_slot_holder_is_refused<H: FenceHarness>(fence: H) -> Option<H> {
    let (paused, next) = (permit(SHARDS, 2, 5, 1), permit(SHARDS, 2, 8, 2));
    fence.write(&paused, 50).await.unwrap();
    fence.write(&next, 80).await.unwrap();
    assert_refused(&fence, &paused, stale("shards (slot 2)", 5, 8, 2)).await;
    let slot2_binding = palisade_sequencer::binding(SHARDS, Access::Slot(2)).into_owned();
    assert_stored(&fence, state_of(&slot2_binding, 8, 2), data(80, &[5, 8])).await;
    Some(fence)
}
