//! The broker's executable: command line and settings → logging → [`queen_broker::app::run`].

use std::process::ExitCode;

use queen_broker::settings::{CommandLineError, Settings};

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
