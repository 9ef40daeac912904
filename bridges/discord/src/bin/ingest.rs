//! `cowboy-discord-ingest`: parses arguments and runs the ingest service of a `discord::Discord` bridge.

fn main() {
    broker::service::main::<discord::Discord>(broker::config::Service::Ingest)
}
