//! `cowboy-console-ping`: parses arguments and runs the ping service of a `console::Console` bridge.

fn main() {
    broker::service::main::<console::Console>(broker::config::Service::Ping)
}
