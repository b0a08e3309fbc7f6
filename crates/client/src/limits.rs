//! The client's limits: constants that more than one module checks or names in a message.

/// Most endpoints one client takes: a cluster has at most 9 members, and a list this long is a
/// mistake, not a deployment.
pub const ENDPOINTS_MAX: usize = 16;
