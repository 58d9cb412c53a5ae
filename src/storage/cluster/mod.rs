//! What every broker on the database shares: the multi-host URL and following the primary through
//! a switchover, and the system flags (maintenance modes).

pub mod hosts;
pub mod system;
