//! `cowboy-discord-outbox`: parses arguments and runs the outbox service of a `discord::Discord` bridge.

fn main() {
    broker::service::main::<discord::Discord>(broker::config::Service::Outbox)
}
