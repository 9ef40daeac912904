//! `cowboy-discord-ping`: parses arguments and runs `discord::run_ping`.

fn main() {
    broker::service::main(discord::TYPE, discord::run_ping)
}
