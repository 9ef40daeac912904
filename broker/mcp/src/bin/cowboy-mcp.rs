//! `cowboy-mcp`: one agent's MCP server over stdio (run as `cowboy mcp --agent NAME`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "cowboy mcp",
    about = "An agent's MCP server: send through the gate, follow what becomes of it"
)]
struct Args {
    #[arg(long, env = "COWBOY_CONFIG", default_value = "/etc/cowboy/cowboy.toml")]
    config: PathBuf,
    /// The agent (`[agents.NAME]`) this server acts for, as its Redis user.
    #[arg(long, env = "COWBOY_AGENT")]
    agent: String,
    /// Seconds a client may take to initialize the session.
    #[arg(long, default_value_t = 30)]
    init_timeout: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // Logs go to standard error: standard output carries the protocol.
    broker::service::init_tracing();
    let config = match broker::Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(broker::service::EXIT_CONFIG as u8);
        }
    };
    let init = Duration::from_secs(args.init_timeout);
    // A bad agent or password file exits as bad config does (78): a
    // supervisor must not restart it in a loop.
    let code = match mcp::serve_stdio(config, &args.agent, init).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            broker::service::exit_code(&e)
        }
    };
    // Exits here: returning would wait for the runtime's blocked read of
    // standard input, which a silent client never ends.
    std::process::exit(code)
}
