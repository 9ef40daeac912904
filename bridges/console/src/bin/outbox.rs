//! `cowboy-console-outbox`: parses arguments and runs `console::run_outbox`.

fn main() {
    broker::service::main(console::TYPE, console::run_outbox)
}
