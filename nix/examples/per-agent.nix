# Two agents with their own streams and ACL users; every service its own user.
let
  files = b: { ingest = "/etc/cowboy/secrets/${b}-ingest"; outbox = "/etc/cowboy/secrets/${b}-outbox"; ping = "/etc/cowboy/secrets/${b}-ping"; };
in
{
  redis = { url = "redis://127.0.0.1:6390"; username = "cowboy-admin"; passwordFile = "/etc/cowboy/secrets/admin"; };
  agents.ann.passwordFile = "/etc/cowboy/secrets/ann";
  agents.bob.passwordFile = "/etc/cowboy/secrets/bob";
  bridges.chat = {
    type = "console";
    destinations = [ "*" ];
    ping = { command = [ "/run/current-system/sw/bin/true" ]; debounce_ms = 500; };
    redisPasswordFiles = files "chat";
    settings = { output = "/var/lib/cowboy/chat.out"; input = "/var/lib/cowboy/chat.in"; };
  };
}
