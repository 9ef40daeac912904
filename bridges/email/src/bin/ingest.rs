//! `cowboy-email-ingest`: parses arguments and runs the ingest service of an `email::Email` bridge.

fn main() {
    broker::service::main::<email::Email>(broker::config::Service::Ingest)
}
