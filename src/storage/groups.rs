//! Consumer groups.
