//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds `migrations/` at
//! compile time, and on stable Rust it only notices edits to files it already knew.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
