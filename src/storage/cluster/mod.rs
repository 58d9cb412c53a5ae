//! What every broker on the database shares: the multi-host URL and following the primary through
//! a switchover, the system flags (maintenance modes), what the database's durability settings
//! promise, and the planner's statistics of the tables the broker grows.

pub mod durability;
pub mod hosts;
pub mod statistics;
pub mod system;
