//! `cowboy-console-ingest`: parses arguments and runs the ingest service of a `console::Console` bridge.

fn main() {
    broker::service::main::<console::Console>(broker::config::Service::Ingest)
}
