//! `cowboy-rebuild-ingest`: runs the ingest service of an `effects::rebuild::Rebuild` bridge.

fn main() {
    broker::service::main::<effects::rebuild::Rebuild>(broker::config::Service::Ingest)
}
