//! placeholder, replaced as the crate's code arrives
