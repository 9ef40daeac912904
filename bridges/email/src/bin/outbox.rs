//! `cowboy-email-outbox`: parses arguments and runs the outbox service of an `email::Email` bridge.

fn main() {
    broker::service::main::<email::Email>(broker::config::Service::Outbox)
}
