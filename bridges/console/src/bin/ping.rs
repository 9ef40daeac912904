//! `cowboy-console-ping`: parses arguments and runs `console::run_ping`.

fn main() {
    broker::service::main(console::TYPE, console::run_ping)
}
