//! Building hand-made histories in a line each.

#![allow(dead_code)]

use palisade_core::{SessionId, Token};
use palisade_history::{
    Access, Action, ClientId, Grant, History, Op, OpId, Outcome, Reply, Violation,
};

pub const TTL_NS: u64 = 1_000;

/// A xorshift generator: the generated histories are the same on every run.
pub struct Rng(pub u64);

impl Rng {
    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

pub fn grant(session: u64, token: u64) -> Grant {
    Grant {
        session: SessionId::new(session),
        token: Token::new(token),
    }
}

/// A grant held shared (a reader) or in a semaphore's slot.
pub fn granted_as(session: u64, token: u64, held: palisade_core::Access) -> Outcome {
    Outcome::Ok(Reply::GrantedAs {
        grant: grant(session, token),
        held,
    })
}

/// An acquire of `lock` in `mode`.
pub fn acquire_as(
    h: &mut History,
    client: u64,
    lock: &str,
    mode: palisade_core::Mode,
    span: (u64, u64),
    outcome: Outcome,
) -> OpId {
    let action = Action::AcquireAs {
        lock: lock.into(),
        ttl_ns: TTL_NS,
        mode,
    };
    push(h, client, action, span, outcome)
}

/// One lock of a multi-acquire: `(request, parts)`, its request and how many locks it named.
pub fn acquire_part(
    h: &mut History,
    client: u64,
    (request, parts): (u64, u32),
    lock: &str,
    mode: palisade_core::Mode,
    span: (u64, u64),
    outcome: Outcome,
) -> OpId {
    let action = Action::AcquirePart {
        lock: lock.into(),
        ttl_ns: TTL_NS,
        mode,
        request,
        parts,
    };
    push(h, client, action, span, outcome)
}

pub fn granted(session: u64, token: u64) -> Outcome {
    Outcome::Ok(Reply::Granted(grant(session, token)))
}

pub fn accepted() -> Outcome {
    Outcome::Ok(Reply::Accepted {
        value: None,
        position: None,
    })
}

pub fn read(value: i64) -> Outcome {
    Outcome::Ok(Reply::Accepted {
        value: Some(value),
        position: None,
    })
}

pub fn at(position: u64) -> Outcome {
    Outcome::Ok(Reply::Accepted {
        value: None,
        position: Some(position),
    })
}

pub const STALE: Outcome = Outcome::Ok(Reply::Stale);

fn push(
    h: &mut History,
    client: u64,
    action: Action,
    (invoke_ns, complete_ns): (u64, u64),
    outcome: Outcome,
) -> OpId {
    h.push(Op {
        client: ClientId(client),
        action,
        invoke_ns,
        complete_ns: Some(complete_ns),
        outcome,
    })
    .unwrap()
}

pub fn acquire(
    h: &mut History,
    client: u64,
    lock: &str,
    span: (u64, u64),
    outcome: Outcome,
) -> OpId {
    let action = Action::Acquire {
        lock: lock.into(),
        ttl_ns: TTL_NS,
    };
    push(h, client, action, span, outcome)
}

pub fn release(
    h: &mut History,
    client: u64,
    lock: &str,
    held: Grant,
    span: (u64, u64),
    outcome: Outcome,
) -> OpId {
    let action = Action::Release {
        lock: lock.into(),
        session: held.session,
        token: held.token,
    };
    push(h, client, action, span, outcome)
}

pub fn renew(h: &mut History, client: u64, session: u64, ttl_ns: u64, span: (u64, u64)) -> OpId {
    let action = Action::Renew {
        session: SessionId::new(session),
        ttl_ns,
    };
    push(h, client, action, span, Outcome::Ok(Reply::Renewed))
}

/// An access to scope `counter` of resource `store`.
pub fn access(
    h: &mut History,
    client: u64,
    grant: Option<Grant>,
    access: Access,
    span: (u64, u64),
    outcome: Outcome,
) -> OpId {
    let action = Action::Resource {
        resource: "store".into(),
        scope: "counter".into(),
        grant,
        access,
    };
    push(h, client, action, span, outcome)
}

pub fn read_access() -> Access {
    Access::Read
}

pub fn write(value: i64) -> Access {
    Access::Write { value }
}

/// The violations of `h`, after printing the report (a failing test shows it).
pub fn violations(h: &History) -> Vec<Violation> {
    let report = h.check();
    eprintln!("{report}");
    report.violations
}

/// A linearizable read of `lock` showing `holder` and `last_token`.
pub fn status(
    h: &mut History,
    client: u64,
    lock: &str,
    span: (u64, u64),
    holder: Option<Grant>,
    last_token: u64,
) -> OpId {
    let action = Action::Status { lock: lock.into() };
    let outcome = Outcome::Ok(Reply::Status {
        holder,
        last_token: Token::new(last_token),
    });
    push(h, client, action, span, outcome)
}
