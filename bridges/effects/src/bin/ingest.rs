//! `cowboy-effects-ingest`: runs the ingest service of an `effects::Effects` bridge.

fn main() {
    broker::service::main::<effects::Effects>(broker::config::Service::Ingest)
}
