//! `cowboy-email-ping`: parses arguments and runs the ping service of an `email::Email` bridge.

fn main() {
    broker::service::main::<email::Email>(broker::config::Service::Ping)
}
