//! Helpers shared by the fence tests: the conformance suite's grants and keys, and unique names.
#![allow(dead_code, unused_imports)]

pub use palisade_fence::testing::{
    assert_nondecreasing, forged_text, grant, public_key, public_keys, reissued, service_key,
    shuffled, skip, stale,
};

/// A name no other test run uses, for scopes and tables in shared servers.
pub fn unique(prefix: &str) -> String {
    // The clock alone is not enough: tests on two threads can read the same instant.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{nanos}_{count}", std::process::id())
}

/// The server address in `var`, or `None` after saying loudly that `what` did not run.
pub fn server(var: &str, what: &str) -> Option<String> {
    let url = std::env::var(var).ok().filter(|url| !url.is_empty());
    if url.is_none() {
        skip(&format!("skipping: {var} is not set; {what} did not run"));
    }
    url
}
