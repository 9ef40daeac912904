//! `cowboy-rebuild-outbox`: runs the outbox service of an `effects::rebuild::Rebuild` bridge.

fn main() {
    broker::service::main::<effects::rebuild::Rebuild>(broker::config::Service::Outbox)
}
