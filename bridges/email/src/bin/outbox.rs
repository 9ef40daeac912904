//! `cowboy-email-outbox`: parses arguments and runs `email::run_outbox`.

fn main() {
    broker::service::main(email::TYPE, email::run_outbox)
}
