//! `cowboy-console-ingest`: parses arguments and runs `console::run_ingest`.

fn main() {
    broker::service::main(console::TYPE, console::run_ingest)
}
