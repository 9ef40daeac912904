# Renders the cowboy config file (the one TOML schema every binary reads) from
# the NixOS module's option values. Pure: builtins only, so it can be evaluated
# and tested without nixpkgs:
#   nix-instantiate --eval --strict --json -E 'import ./render.nix (import ./examples/minimal.nix)'
#
# Keys are mapped one by one (never passed through), so a key the Rust schema
# gains is missing here until the module can express it; the test suite compares
# the two. Only `settings`, the bridge type's own keys, is freeform.
#
# Secrets are never rendered: a bridge's `secrets` name a key and a source file,
# and the key is rendered as `$CREDENTIALS_DIRECTORY/<credential>`, which each
# unit receives through LoadCredential (the loader expands the variable). With
# `credentialsDirectory = null` the source paths are rendered instead, for tools
# run by root (the operator CLI, `cowboy acl`).
{ redis ? { }, agents ? { }, operators ? { }, people ? { }, bridges ? { }, audit ? { }, web ? null, credentialsDirectory ? "$CREDENTIALS_DIRECTORY" }:
let
  inherit (builtins) attrNames concatStringsSep filter isAttrs isBool isFloat isInt isList isPath isString map match replaceStrings typeOf;

  nonNull = as: removeAttrs as (filter (n: as.${n} == null) (attrNames as));
  esc = s: replaceStrings [ "\\" "\"" "\n" "\r" "\t" ] [ "\\\\" "\\\"" "\\n" "\\r" "\\t" ] s;
  key = k: if match "[A-Za-z0-9_-]+" k != null then k else "\"${esc k}\"";
  value = v:
    if isString v || isPath v then "\"${esc (toString v)}\""
    else if isBool v then (if v then "true" else "false")
    else if isInt v || isFloat v then toString v
    else if isList v then "[" + concatStringsSep ", " (map value v) + "]"
    else if isAttrs v then
      "{ " + concatStringsSep ", " (map (n: "${key n} = ${value v.${n}}") (attrNames (nonNull v))) + " }"
    else throw "cowboy: cannot render a ${typeOf v} as TOML";
  table = name: attrs:
    let a = nonNull attrs; in
    "[${name}]\n" + concatStringsSep "" (map (n: "${key n} = ${value a.${n}}\n") (attrNames a)) + "\n";

  # "smtp.password_file" = /path  ->  { smtp = { password_file = "$CREDENTIALS_DIRECTORY/smtp.password_file"; }; }
  credential = secrets: k:
    if credentialsDirectory == null then toString secrets.${k} else "${credentialsDirectory}/${k}";
  nest = path: v:
    if path == [ ] then v
    else { ${builtins.head path} = nest (builtins.tail path) v; };
  merge = a: b:
    a // builtins.mapAttrs (n: v: if isAttrs v && isAttrs (a.${n} or null) then merge a.${n} v else v) b;
  secretTree = secrets:
    builtins.foldl' (acc: k: merge acc (nest (builtins.filter isString (builtins.split "\\." k)) (credential secrets k))) { } (attrNames secrets);

  bridgeTable = name: b:
    let
      approval = b.approval or { };
      ping = b.ping or { };
      files = b.redisPasswordFiles or { };
    in
    table "bridges.${key name}" (merge (b.settings or { }) (secretTree (b.secrets or { })) // {
      type = b.type;
      approval = nonNull {
        required = approval.required or null;
        notify = approval.notify or null;
        notify_channel = approval.notify_channel or null;
        timeout = approval.timeout or null;
        approvers = approval.approvers or null;
        quorum = approval.quorum or null;
        editors_count = approval.editors_count or null;
        trust_surfaces = approval.trust_surfaces or null;
        max_parked_per_agent = approval.max_parked_per_agent or null;
        max_parked_bytes_per_agent = approval.max_parked_bytes_per_agent or null;
        max_parked = approval.max_parked or null;
        max_snooze = approval.max_snooze or null;
        max_snoozes = approval.max_snoozes or null;
        snooze = approval.snooze or null;
        remind_after = approval.remind_after or null;
        digest = approval.digest or null;
        digest_to = approval.digest_to or null;
        digest_channel = approval.digest_channel or null;
        also = if (approval.also or [ ]) == [ ] then null else approval.also;
        escalate = if (approval.escalate or [ ]) == [ ] then null else approval.escalate;
      };
      ping = nonNull {
        command = ping.command or null;
        debounce_ms = ping.debounce_ms or null;
      };
      destinations = b.destinations or null;
      max_content_bytes = b.max_content_bytes or null;
      batch = b.batch or null;
      max_in_flight = b.max_in_flight or null;
      max_attempts = b.max_attempts or null;
      max_retry_seconds = b.max_retry_seconds or null;
      claim_idle_seconds = b.claim_idle_seconds or null;
      max_deliveries = b.max_deliveries or null;
      retention_seconds = b.retention_seconds or null;
      dead_letter_retention_seconds = b.dead_letter_retention_seconds or null;
      redis_password_files = nonNull {
        ingest = files.ingest or null;
        outbox = files.outbox or null;
        ping = files.ping or null;
      };
    });

  enabled = filter (n: bridges.${n}.enable or true) (attrNames bridges);

  # The page's files are credentials of its unit (named web-*), like a bridge's secrets.
  webFile = cred: path: if path == null then null else if credentialsDirectory == null then toString path else "${credentialsDirectory}/${cred}";
  webUsers = web.users or { };
  webTables =
    table "web" {
      listen = web.listen or null;
      exporter_listen = web.exporterListen or null;
      session_hours = web.sessionHours or null;
      secure_cookies = web.secureCookies or null;
      session_key_file = webFile "web-session-key" (web.sessionKeyFile or null);
      redis_password_file = webFile "web-redis-password" (web.redisPasswordFile or null);
      exporter_password_file = webFile "web-exporter-password" (web.exporterRedisPasswordFile or null);
      trusted_proxies = web.trustedProxies or null;
      public_url = web.publicUrl or null;
    }
    + concatStringsSep "" (map (u: table "web.users.${key u}" { password_file = webFile "web-user-${u}" webUsers.${u}.passwordFile; }) (attrNames webUsers));
in
table "redis" {
  # Behind Sentinels, or on a cluster, where data lives is theirs to say: no url.
  url = if (redis.sentinels or [ ]) != [ ] || (redis.cluster or [ ]) != [ ] then null else redis.url or "redis://127.0.0.1:6379";
  username = redis.username or null;
  password_file = redis.passwordFile or null;
  ca_file = redis.caFile or null;
  client_cert_file = redis.clientCertFile or null;
  client_key_file = webFile "redis-client-key" (redis.clientKeyFile or null);
  allow_plaintext = redis.allowPlaintext or null;
  sentinels = if (redis.sentinels or [ ]) == [ ] then null else redis.sentinels;
  master_name = redis.masterName or null;
  cluster = if (redis.cluster or [ ]) == [ ] then null else redis.cluster;
  sentinel_username = redis.sentinelUsername or null;
  sentinel_password_file = webFile "redis-sentinel-password" (redis.sentinelPasswordFile or null);
  wait_replicas = redis.waitReplicas or null;
  wait_timeout_ms = redis.waitTimeoutMs or null;
}
+ (if audit ? retentionDays then table "audit" { retention_days = audit.retentionDays; } else "")
+ (if web == null then "" else webTables)
+ concatStringsSep "" (map (a: table "agents.${key a}" { password_file = agents.${a}.passwordFile or null; }) (attrNames agents))
+ concatStringsSep "" (map (o: table "operators.${key o}" { password_file = operators.${o}.passwordFile or null; }) (attrNames operators))
+ concatStringsSep "" (map (p: table "people.${key p}" { identities = people.${p}.identities; }) (attrNames people))
+ concatStringsSep "" (map (n: bridgeTable n bridges.${n}) enabled)
