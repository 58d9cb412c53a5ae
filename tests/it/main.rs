//! The broker's integration tests, as ONE test binary: one module per area, all sharing
//! `support` — one throwaway PostgreSQL cluster for the binary, a database per test cloned from
//! a migrated template, brokers on 127.0.0.1:0. Tests that run the broker as a child process
//! (`process_lifecycle`, the SIGKILL tests of `crash_spool`, `timers` and `chaos_locks`) or stop
//! a cluster (`outage_cluster`, which starts its own) live here too: none of them touches the
//! shared cluster's server.
//!
//! Run one area with `cargo test --test it <module>::`, e.g. `cargo test --test it pop_basic::`.

mod ack_basic;
mod ack_group;
mod ack_window;
mod auth_keys;
mod auth_matrix;
mod auth_producer_sub;
mod chaos;
mod chaos_clock;
mod chaos_faults;
mod chaos_locks;
mod chaos_state;
mod claim_group;
mod codec_props;
mod configure_contract;
mod conns;
mod consume_ahead;
mod consume_cache;
mod consume_handoff;
mod consume_live;
mod crash_spool;
mod dashboard_routes;
mod depth;
mod encryption;
mod ephemeral;
mod features;
mod fuzz_corpus;
mod grafana;
mod groups_basic;
mod ha_failover;
mod ha_patroni;
mod history;
mod hostile_input;
mod kafka;
mod kv;
mod lag_passes;
mod lease_basic;
mod locks;
mod longpoll_basic;
mod maintenance;
mod messages_routes;
mod observability;
mod outage_cluster;
mod outage_proxy;
mod planner_statistics;
mod pop_2x;
mod pop_basic;
mod pop_fairness;
mod pop_framed;
mod pop_options;
mod pop_outage;
mod pop_scale;
mod pop_watermark;
mod probe2;
mod process_lifecycle;
mod push_backpressure;
mod push_binary;
mod push_concurrency;
mod push_contract;
mod push_dedup;
mod push_eviction;
mod queue_limits;
mod reads;
mod resource_limits;
mod resources_routes;
mod retention_sweep;
mod spool_faults;
mod status_routes;
mod storage_errors;
mod streams;
mod support;
mod switchover;
mod timers;
mod tls;
mod transaction_basic;
mod transaction_riders;
mod views_paging;
