//! `cowboy-rebuild-ping`: runs the ping service of an `effects::rebuild::Rebuild` bridge.

fn main() {
    broker::service::main::<effects::rebuild::Rebuild>(broker::config::Service::Ping)
}
