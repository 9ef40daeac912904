//! `cowboy-console-outbox`: parses arguments and runs the outbox service of a `console::Console` bridge.

fn main() {
    broker::service::main::<console::Console>(broker::config::Service::Outbox)
}
