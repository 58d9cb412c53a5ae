//! One measurement, start to finish: a fresh database, the suite's measurement (push and
//! baselines, spool, consume, autopilot: the consume measurements with other pops), and the
//! database dropped again. The only module that knows every
//! suite; the suites know only the modules below them.

use std::time::Instant;

use crate::db::Server;
use crate::measurement::Measurement;
use crate::scenario::{trace, Kind, Params, PopStyle, Scenario, LIVE_PUSH_BATCH, POP_BATCH};
use crate::BoxError;
use crate::{brokers, consume, push, spool};

/// Measures one scenario once.
///
/// # Errors
///
/// When setup fails (a failing request inside the window is counted, not fatal).
pub async fn run(
    server: &mut Server,
    params: &Params,
    scenario: Scenario,
    round: usize,
    push_only: Option<f64>,
) -> Result<Measurement, BoxError> {
    let t = Instant::now();
    let name = server.create_database().await?;
    trace(params, "create database", t);
    let url = server.url(&name);
    let result = run_in(server, params, scenario, round, &url, &name, push_only).await;
    let t = Instant::now();
    server.drop_database(&name).await?;
    trace(params, "drop database", t);
    result
}

async fn run_in(
    server: &mut Server,
    params: &Params,
    scenario: Scenario,
    round: usize,
    url: &str,
    name: &str,
    push_only: Option<f64>,
) -> Result<Measurement, BoxError> {
    let profiled = params.profile.then_some(name);
    match scenario.kind {
        Kind::Spool { batch } => spool::run(server, params, scenario, round, url, batch).await,
        Kind::Brokers {
            brokers,
            end_to_end,
        } => brokers::run(server, params, scenario, round, url, brokers, end_to_end).await,
        Kind::PopAck { batch } | Kind::EncryptedPopAck { batch } => {
            let run = consume::Run {
                scenario,
                round,
                url,
                profiled,
            };
            let style = PopStyle::Fixed { batch, wait: false };
            consume::pop_ack(server, params, run, style, params.prefill).await
        }
        Kind::EndToEnd { batch, pace_pct } => {
            let run = consume::Run {
                scenario,
                round,
                url,
                profiled,
            };
            let pace = match (pace_pct, push_only) {
                (0, _) => None,
                (pct, Some(rate)) => Some(rate * f64::from(pct) / 100.0),
                (_, None) => {
                    return Err(
                        "a paced end-to-end run needs the same round's push-only rate".into(),
                    )
                }
            };
            let style = PopStyle::Fixed {
                batch: POP_BATCH,
                wait: true,
            };
            consume::end_to_end(server, params, run, batch, pace, style).await
        }
        Kind::Autopilot { pop, live_rate } => {
            let run = consume::Run {
                scenario,
                round,
                url,
                profiled,
            };
            if live_rate == 0 {
                consume::pop_ack(server, params, run, pop, params.autopilot_prefill).await
            } else {
                let rate = Some(f64::from(live_rate));
                consume::end_to_end(server, params, run, LIVE_PUSH_BATCH, rate, pop).await
            }
        }
        Kind::Wakeup => {
            let run = consume::Run {
                scenario,
                round,
                url,
                profiled,
            };
            consume::wakeup(server, params, run).await
        }
        Kind::Broker { .. }
        | Kind::EncryptedPush { .. }
        | Kind::SegmentRows
        | Kind::SegmentTxn
        | Kind::Naive
        | Kind::SingleCommits => push::run(server, params, scenario, round, url, profiled).await,
    }
}
