//! `cowboy-slack-outbox`: parses arguments and runs the outbox service of a `slack::Slack` bridge.

fn main() {
    broker::service::main::<slack::Slack>(broker::config::Service::Outbox)
}
