//! `cowboy-slack-ping`: parses arguments and runs the ping service of a `slack::Slack` bridge.

fn main() {
    broker::service::main::<slack::Slack>(broker::config::Service::Ping)
}
