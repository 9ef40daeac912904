//! `cowboy`: the operator CLI. Parses arguments and runs them (`broker::cli::run`).

use std::process::ExitCode;

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    broker::cli::run(broker::cli::Args::parse()).await
}
