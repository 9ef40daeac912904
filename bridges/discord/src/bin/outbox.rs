//! `cowboy-discord-outbox`: parses arguments and runs `discord::run_outbox`.

fn main() {
    broker::service::main(discord::TYPE, discord::run_outbox)
}
