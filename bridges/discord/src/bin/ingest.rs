//! `cowboy-discord-ingest`: parses arguments and runs `discord::run_ingest`.

fn main() {
    broker::service::main(discord::TYPE, discord::run_ingest)
}
