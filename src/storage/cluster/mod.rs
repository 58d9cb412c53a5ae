//! What every broker on the database shares: the multi-host URL and following the primary through
//! a switchover, the system flags (maintenance modes), and what the database's durability
//! settings promise.

pub mod durability;
pub mod hosts;
pub mod system;
