//! `cowboy-effects-ping`: runs the ping service of an `effects::Effects` bridge.

fn main() {
    broker::service::main::<effects::Effects>(broker::config::Service::Ping)
}
