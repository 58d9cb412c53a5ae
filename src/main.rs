//! The broker's executable: command line and settings → logging → [`queen_broker::app::run`].

use std::process::ExitCode;

use queen_broker::settings::{CommandLineError, Settings};

/// jemalloc, not glibc's malloc: glibc gives each allocating thread (HTTP workers, the
/// partition and committer arbiters) an arena of its own and keeps every arena at its
/// high-water mark; with 10 000 live partitions that was ≈ 20 MB of resident memory above the
/// heap in use (docs/benchmarks.md, "Partitions at scale").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at start; `_RJEM_MALLOC_CONF` in the environment overrides
/// them one by one. Freed pages go back to the system after 100 ms instead of 10 s, and
/// threads keep no caches of freed blocks. `dirty_decay_ms:0` (at once) takes ≈ 4 MB more off
/// the peak but costs ≈ 2 µs of broker CPU per pushed message (docs/benchmarks.md).
#[allow(unsafe_code, non_upper_case_globals)] // a C string that jemalloc looks up by name
#[export_name = "_rjem_malloc_conf"]
static malloc_conf: &[u8; 49] = b"dirty_decay_ms:100,muzzy_decay_ms:0,tcache:false\0";

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
    match actix_web::rt::System::new().block_on(queen_broker::app::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("queen-broker stopped: {e}");
            eprintln!("queen-broker: {e}");
            ExitCode::from(1)
        }
    }
}
