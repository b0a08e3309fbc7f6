//! The in-memory fenced resource: the conformance suite, and a resource bound to its lock
//! before its first write.

mod common;

use common::grant;
use palisade_fence::MemoryResource;
use palisade_fence::testing::{self, MemoryHarness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_resource_passes_the_fence_conformance_suite() {
    testing::run_all(MemoryHarness::fresh).await;
}

#[test]
fn a_resource_bound_to_a_lock_refuses_other_locks_from_the_first_write() {
    let resource = MemoryResource::bound_to("report", 0u64);
    let err = resource
        .write(&grant("other", 1, 1), |value| *value = 1)
        .unwrap_err();
    assert!(err.is_wrong_lock());
    assert_eq!(resource.fence_state().unwrap(), None);
    resource
        .write(&grant("report", 1, 1), |value| *value = 2)
        .unwrap();
    assert_eq!(resource.read(|value| *value).unwrap(), 2);
}
