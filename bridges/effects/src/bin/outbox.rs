//! `cowboy-effects-outbox`: runs the outbox service of an `effects::Effects` bridge.

fn main() {
    broker::service::main::<effects::Effects>(broker::config::Service::Outbox)
}
