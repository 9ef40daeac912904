//! `cowboy-slack-ingest`: parses arguments and runs the ingest service of a `slack::Slack` bridge.

fn main() {
    broker::service::main::<slack::Slack>(broker::config::Service::Ingest)
}
