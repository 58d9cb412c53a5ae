//! The broker's executable: settings → logging → [`queen_broker::app::run`].

use std::process::ExitCode;

use queen_broker::settings::Settings;

fn main() -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("queen-broker: {e}");
            return ExitCode::from(2);
        }
    };
    // `tracing` events reach env_logger through tracing's `log` bridge (no subscriber is set).
    env_logger::Builder::new()
        .parse_filters(&format!(
            "warn,queen_broker={0},broker_actors={0}",
            settings.log_level
        ))
        .parse_env("RUST_LOG")
        .init();
    match actix_web::rt::System::new().block_on(queen_broker::app::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("queen-broker stopped: {e}");
            eprintln!("queen-broker: {e}");
            ExitCode::from(1)
        }
    }
}
