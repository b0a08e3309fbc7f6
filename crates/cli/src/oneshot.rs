//! `palisade acquire`, `renew`, `release`: the one-shot flow for scripts.
//!
//! `acquire` opens a session that nothing keeps alive, takes the lock and prints the grant; the
//! script then renews the session (`renew`) before its ttl runs out, and releases the lock
//! (`release`) when done — or lets the session expire, which releases it too.
//!
//! ```sh
//! eval "$(palisade acquire jobs/nightly --ttl 60s)"
//! export PALISADE_SESSION
//! palisade store put report "$(date)" --sequencer "$PALISADE_SEQUENCER"
//! palisade release "$PALISADE_LOCK"
//! ```
//!
//! `PALISADE_SESSION` is the session's credential, `<id>.<secret>`: the id alone acts for
//! nothing (only whoever opened a session may act for it), so keep the value as secret as the
//! lock. A bare id, the form before session secrets, is refused with an error that says so.
//! `renew` and `release` read it from the environment; given as `--session` instead, it shows
//! in the process list, and `main` warns of it (N16).

use std::process::ExitCode;
use std::time::Duration;

use palisade_client::{
    AcquireError, AcquireOptions, Client, ReleaseError, SessionCredential, SessionId, Wait,
};
use palisade_core::{HeldBy, holder_clause};
use serde_json::json;

use crate::Global;
use crate::args::{describe_wait, parse_duration, parse_value, parse_wait};
use crate::exit::{self, Exit};
use crate::output::{human_duration, shell_assignments};

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct AcquireArgs {
    /// Name of the lock.
    pub name: String,
    /// Session lease: the lock is released this long after the last renewal (`palisade renew`).
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Duration,
    /// How long to wait for the lock: a duration (0 = only if free now) or `forever`. The
    /// session is renewed while waiting.
    #[arg(long, default_value = "0", value_parser = parse_wait)]
    pub wait: Wait,
    /// Attach this value to the grant: `status`, `locks` and `watch` show it beside the
    /// holder (1 to 1024 bytes, no control characters).
    #[arg(long, value_parser = parse_value)]
    pub value: Option<String>,
    /// Print a JSON object instead of `KEY=value` lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct RenewArgs {
    /// The session to renew: the value `palisade acquire` printed as PALISADE_SESSION
    /// (`<id>.<secret>`, a secret: whoever has it acts for the session). Prefer the exported
    /// environment variable: a flag's value is visible in `ps`.
    #[arg(long, env = "PALISADE_SESSION", hide_env_values = true)]
    pub session: SessionCredential,
    /// Print a JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
#[command(after_help = exit::HELP)]
pub struct ReleaseArgs {
    /// Name of the lock.
    #[arg(env = "PALISADE_LOCK")]
    pub name: String,
    /// The session holding the lock: the value `palisade acquire` printed as PALISADE_SESSION
    /// (`<id>.<secret>`). Prefer the exported environment variable: a flag's value is visible
    /// in `ps`.
    #[arg(long, env = "PALISADE_SESSION", hide_env_values = true)]
    pub session: SessionCredential,
    /// Print a JSON object.
    #[arg(long)]
    pub json: bool,
}

pub async fn acquire(args: AcquireArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = global.connect().await?;
    let lease = client.open_session_without_keepalive(args.ttl).await?;
    let credential = lease.credential;
    // Keep the session alive while waiting in the queue, not after: a wait longer than the ttl
    // must not end with a grant to an expired session.
    let options = AcquireOptions {
        wait: args.wait,
        value: args.value.clone(),
        mode: palisade_core::Mode::Exclusive,
    };
    let acquire = client.acquire(credential, &args.name, options);
    let result = tokio::select! {
        result = acquire => result,
        () = renew_forever(&client, credential, lease.ttl / 3) => unreachable_renewal(),
    };
    let grant = match result {
        Ok(grant) => grant,
        Err(error) => {
            let closed = client.close_session(credential).await;
            return Err(not_acquired(&client, lease.session, args.wait, error, closed).await);
        }
    };
    if args.json {
        let object = json!({
            "lock": grant.lock,
            "token": grant.token,
            "sequencer": grant.sequencer,
            "session": grant.session,
            "session_credential": credential.to_string(),
            "ttl_ms": u64::try_from(lease.ttl.as_millis()).unwrap_or(u64::MAX),
        });
        println!("{object}");
    } else {
        print!(
            "{}",
            shell_assignments(&[
                ("PALISADE_LOCK", grant.lock.clone()),
                ("PALISADE_TOKEN", grant.token.to_string()),
                ("PALISADE_SEQUENCER", grant.sequencer.clone()),
                ("PALISADE_SESSION", credential.to_string()),
            ])
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Renews `session` every `interval` until cancelled; failures are left to the acquire to
/// report (a session that is gone ends the wait with its own error).
async fn renew_forever(client: &Client, session: SessionCredential, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        if let Err(error) = client.renew(session).await {
            tracing::warn!(session = session.id().get(), %error, "renewing the session while waiting failed");
        }
    }
}

fn unreachable_renewal() -> Result<palisade_client::Grant, AcquireError> {
    Err(AcquireError::Protocol(
        "the renewal loop ended, which it never does".to_string(),
    ))
}

/// Explains why an acquire did not end in a grant, once the caller has closed the session
/// (`closed` is that outcome): a wait that ended, or an outcome the session's closing settled.
pub async fn not_acquired(
    client: &Client,
    session: SessionId,
    wait: Wait,
    error: AcquireError,
    closed: Result<(), palisade_client::CloseError>,
) -> anyhow::Error {
    match error {
        AcquireError::WaitEnded { lock } => Exit::new(
            exit::NOT_ACQUIRED,
            format!(
                "lock {lock:?} was not acquired within {}{}",
                describe_wait(wait),
                holder_suffix(client, &lock).await
            ),
        )
        .into(),
        error if error.outcome_unknown() => match closed {
            Ok(()) | Err(palisade_client::CloseError::SessionNotFound { .. }) => Exit::new(
                exit::UNAVAILABLE,
                format!("{error}; session {session} was then closed, so the lock is not held"),
            )
            .into(),
            Err(close_error) => Exit::new(
                exit::OUTCOME_UNKNOWN,
                format!("{error}; closing the session failed too: {close_error}"),
            )
            .into(),
        },
        error => error.into(),
    }
}

/// `; it is held by session S with token T`, or nothing if the lock is free or unknown.
pub async fn holder_suffix(client: &Client, lock: &str) -> String {
    match client.status(lock).await {
        Ok(status) => match status.holder {
            Some(h) => holder_clause(Some(HeldBy::with_token(h.session, h.token))),
            None => String::new(),
        },
        Err(_) => String::new(),
    }
}

pub async fn renew(args: RenewArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = global.connect().await?;
    let remaining = client.renew(args.session).await?;
    if args.json {
        let object = json!({
            "session": args.session.id(),
            "lease_remaining_ms": u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
        });
        println!("{object}");
    } else {
        println!(
            "session {} renewed: {} remaining",
            args.session.id(),
            human_duration(remaining)
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn release(args: ReleaseArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let client = global.connect().await?;
    let token = match client.release(args.session, &args.name).await {
        Ok(token) => token,
        Err(ReleaseError::NotHolder {
            lock,
            session,
            holder_session,
        }) => {
            let holder = match holder_session {
                Some(_) => holder_suffix(&client, &lock).await,
                None => holder_clause(None),
            };
            // The holder may have changed between the refusal and the status read.
            let holder = if holder.is_empty() {
                holder_clause(holder_session.map(HeldBy::session))
            } else {
                holder
            };
            return Err(Exit::new(
                exit::REFUSED,
                format!("session {session} does not hold lock {lock:?}{holder}"),
            )
            .into());
        }
        Err(error) => return Err(error.into()),
    };
    if args.json {
        let object = json!({
            "lock": args.name,
            "session": args.session.id(),
            "token": token,
        });
        println!("{object}");
    } else {
        match token {
            Some(token) => println!("released lock {:?} (token {token})", args.name),
            None => println!(
                "withdrew the wait of session {} for lock {:?}",
                args.session.id(),
                args.name
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}
