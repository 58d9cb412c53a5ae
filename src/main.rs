//! The broker's executable: command line and settings → logging → [`queen_broker::app::run`].

use std::process::ExitCode;

use queen_broker::settings::{CommandLineError, Settings};

/// jemalloc, not glibc's malloc: glibc gives each allocating thread (HTTP workers, the
/// partition and committer arbiters) an arena of its own and keeps every arena at its
/// high-water mark; with 10 000 live partitions that was ≈ 20 MB of resident memory above the
/// heap in use (docs/history/benchmarks.md, "Partitions at scale").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at start; `_RJEM_MALLOC_CONF` in the environment overrides
/// them one by one. Freed pages go back to the system after 100 ms instead of 10 s. Each thread
/// keeps a small cache of freed blocks (blocks up to 1 KiB, at most 32 of a size): without it
/// every free takes its arena's lock, ≈ 15–20 % of the broker's CPU per message pushed or
/// consumed; bounded so, it adds ≈ 2 MB to the peak RSS (docs/history/benchmarks.md, "Peak RSS: the
/// allocator" and "Thread caches"). `dirty_decay_ms:0` (at once) takes ≈ 4 MB more off the peak
/// but costs ≈ 2 µs of broker CPU per pushed message.
#[allow(unsafe_code, non_upper_case_globals)] // a C string that jemalloc looks up by name
#[export_name = "_rjem_malloc_conf"]
static malloc_conf: &[u8; 91] =
    b"dirty_decay_ms:100,muzzy_decay_ms:0,tcache:true,tcache_max:1024,tcache_nslots_small_max:32\0";

fn main() -> ExitCode {
    // The command line over the environment; `--help` and `--version` are answered here,
    // before anything is opened or connected.
    let env = std::env::vars().collect();
    let settings = match Settings::from_command_line(std::env::args_os(), env) {
        Ok(settings) => settings,
        Err(CommandLineError::Args(e)) => e.exit(),
        Err(e) => {
            eprintln!("queen-broker: {e}");
            return ExitCode::from(2);
        }
    };
    // `tracing` events reach env_logger through tracing's `log` bridge (no subscriber is set).
    queen_broker::logging::init(&settings.log_level, settings.log_json);
    // The layout of written segments is the process's, fixed here (brokers started in-process,
    // as the tests start them, write the default).
    queen_broker::storage::segments::frames::write_items(settings.segment_items);
    match actix_web::rt::System::new().block_on(queen_broker::app::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("queen-broker stopped: {e}");
            eprintln!("queen-broker: {e}");
            ExitCode::from(1)
        }
    }
}
