# Every option the module renders, set: the test suite checks that this covers
# every key of the Rust schema (so a new Rust key fails until the module has it).
{
  redis = { url = "rediss://redis.example.org:6390"; caFile = "/etc/cowboy/redis-ca.pem"; clientCertFile = "/etc/cowboy/redis-client.pem"; clientKeyFile = "/etc/cowboy/secrets/redis-client.key"; allowPlaintext = false; username = "cowboy-admin"; passwordFile = "/etc/cowboy/secrets/admin"; };
  agents.ann.passwordFile = "/etc/cowboy/secrets/ann";
  operators.root.passwordFile = "/etc/cowboy/secrets/root";
  people.root.identities = [ "cli:root" "web:root" ];
  audit.retentionDays = 30;
  web = {
    listen = "127.0.0.1:8787";
    exporterListen = "127.0.0.1:9787";
    sessionHours = 4;
    secureCookies = true;
    sessionKeyFile = "/etc/cowboy/secrets/web-session";
    redisPasswordFile = "/etc/cowboy/secrets/web-redis";
    exporterRedisPasswordFile = "/etc/cowboy/secrets/exporter-redis";
    trustedProxies = [ "127.0.0.1" ];
    publicUrl = "https://approvals.example.org";
    users.root.passwordFile = "/etc/cowboy/secrets/web-root.hash";
  };
  bridges.all = {
    type = "console";
    destinations = [ "*" ];
    max_content_bytes = 1000;
    batch = 8;
    max_in_flight = 4;
    max_attempts = 5;
    max_retry_seconds = 60;
    claim_idle_seconds = 30;
    max_deliveries = 5;
    retention_seconds = 3600;
    dead_letter_retention_seconds = 86400;
    outboxWorkers = [ "b" ];

    approval = { required = true; notify = "all"; notify_channel = "ops"; timeout = 0; approvers = [ "cli:root" ]; quorum = 1; editors_count = false; trust_surfaces = false; max_parked_per_agent = 500; max_parked_bytes_per_agent = 8388608; max_parked = 5000; max_snooze = 7200; max_snoozes = 2; snooze = 1800; remind_after = 900; digest = "daily"; digest_to = "desk"; digest_channel = "ann@example.org"; also = [ { notify = "desk"; notify_channel = "cards"; } ]; escalate = [ { after = 3600; notify = "night"; notify_channel = "pager"; approvers = [ "web:root" ]; people = [ "root" ]; } ]; };
    ping = { command = [ "/bin/true" ]; debounce_ms = 100; };
    redisPasswordFiles = { ingest = "/s/i"; outbox = "/s/o"; ping = "/s/p"; };
    secrets = { "token_file" = "/etc/cowboy/secrets/token"; };
    settings = { output = "/o"; input = "/i"; };
  };
  # Carries the digest of `all` (a bridge that asks for no approval).
  # Also asked on (`also`): its cards go to `cards`, its digests elsewhere.
  # Asked an hour later when nobody answered (`escalate`).
  bridges.night = { type = "console"; destinations = [ "pager" ]; settings = { output = "/n"; input = "/ni"; }; };
  bridges.desk = { type = "console"; destinations = [ "ann@example.org" "cards" ]; settings = { output = "/d"; input = "/di"; }; };
}
