//! `cowboy-web`: the approval page, the metrics exporter, and the password
//! hasher for `[web.users]` (run as `cowboy web …` and `cowboy exporter`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cowboy web", about = "The cowboy approval page and metrics")]
struct Args {
    #[arg(
        long,
        env = "COWBOY_CONFIG",
        global = true,
        default_value = "/etc/cowboy/cowboy.toml"
    )]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the page on `[web] listen` (the default).
    Serve,
    /// Serve `/metrics` alone on `[web] exporter_listen`.
    Exporter,
    /// Read a password from standard input and print its Argon2 hash for a
    /// `[web.users.NAME] password_file`.
    HashPassword,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::HashPassword) = args.command {
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line).is_err()
            || line.trim_end_matches(['\n', '\r']).is_empty()
        {
            eprintln!("error: give the password on standard input");
            return ExitCode::FAILURE;
        }
        println!(
            "{}",
            web::auth::hash_password(line.trim_end_matches(['\n', '\r']))
        );
        return ExitCode::SUCCESS;
    }
    broker::service::init_tracing();
    let config = match broker::Config::load(&args.config) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(broker::service::EXIT_CONFIG as u8);
        }
    };
    let page = !matches!(args.command, Some(Command::Exporter));
    let Some(web) = config.web.clone() else {
        eprintln!("error: web: no [web] table in {}", args.config.display());
        return ExitCode::from(broker::service::EXIT_CONFIG as u8);
    };
    let listen = if page {
        web.listen
    } else {
        web.exporter_listen
    };
    // Under ACLs the exporter reads as its own user: never as the administrator.
    if !page && config.redis.username.is_some() && web.exporter_password_file.is_none() {
        eprintln!("error: invalid config: `web.exporter_password_file`: the exporter reads as its own Redis user cowboy-exporter (render it with `cowboy acl`); it never runs as the [redis] administrator");
        return ExitCode::from(broker::service::EXIT_CONFIG as u8);
    }
    let role = if page {
        web::Role::Page
    } else {
        web::Role::Exporter
    };
    let app = match web::App::new_for(config, broker::Clock::system(), role).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (shutdown, _signals) = match broker::Shutdown::from_signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(listen, page, "cowboy web serving");
    broker::systemd::ready();
    // The units' shared drop-in sets WatchdogSec: beat while serving.
    tokio::spawn(async {
        let mut watchdog = broker::systemd::Watchdog::from_env();
        let Some(every) = watchdog.interval() else {
            return;
        };
        loop {
            tokio::time::sleep(every).await;
            watchdog.tick();
        }
    });
    match web::serve(app, listener, shutdown, page).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
