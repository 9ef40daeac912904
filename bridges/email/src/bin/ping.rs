//! `cowboy-email-ping`: parses arguments and runs `email::run_ping`.

fn main() {
    broker::service::main(email::TYPE, email::run_ping)
}
