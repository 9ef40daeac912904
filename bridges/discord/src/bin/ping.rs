//! `cowboy-discord-ping`: parses arguments and runs the ping service of a `discord::Discord` bridge.

fn main() {
    broker::service::main::<discord::Discord>(broker::config::Service::Ping)
}
