//! `cowboy-email-ingest`: parses arguments and runs `email::run_ingest`.

fn main() {
    broker::service::main(email::TYPE, email::run_ingest)
}
