# NixOS module: services.cowboy.bridges.<name> -> three hardened units per bridge
# (cowboy-<name>-ingest, -outbox, -ping) under cowboy.target, a dedicated Redis
# with the ACL users file that `cowboy acl` renders, and the one config file of
# the Rust loader, rendered by ./render.nix.
{ config, lib, pkgs, ... }:

let
  inherit (lib) mkOption mkEnableOption mkIf mkDefault types mapAttrs mapAttrs' nameValuePair
    filterAttrs attrNames concatMap mapAttrsToList optional optionals optionalAttrs optionalString literalExpression;

  cfg = config.services.cowboy;
  render = import ./render.nix;
  services = [ "ingest" "outbox" "ping" ];
  enabledBridges = filterAttrs (_: b: b.enable) cfg.bridges;
  # The bridge types, one list for the Rust loader and this module.
  registry = builtins.fromTOML (builtins.readFile ../bridges/registry/bridges.toml);

  approvalOptions = {
    required = mkOption { type = types.nullOr types.bool; default = null; description = "Hold outbound messages until a human approves them. Null: true on a gated bridge type (see bridges/registry/bridges.toml: effects, rebuild), which cannot turn it off; false otherwise."; };
    notify = mkOption { type = types.nullOr types.str; default = null; description = "Bridge whose outbox carries the approval notifications (default: this bridge)."; };
    notify_channel = mkOption { type = types.str; default = ""; description = "Destination within the notify bridge (channel id, address)."; };
    timeout = mkOption { type = types.ints.unsigned; default = 3600; description = "Seconds before a pending approval expires; 0 = never."; };
    approvers = mkOption {
      type = types.listOf types.str; default = [ ];
      example = [ "discord:80351110224678912" "email:ann@example.org" ];
      description = "Who may decide, as `type:id`. Empty: nobody can approve.";
    };
    quorum = mkOption { type = types.ints.positive; default = 1; description = "Distinct people (services.cowboy.people) who must approve; one rejection rejects."; };
    max_parked_per_agent = mkOption { type = types.ints.unsigned; default = 1000; description = "Most approvals one agent may have waiting on this bridge (beyond: refused with limit_reached); 0 = no limit."; };
    max_parked_bytes_per_agent = mkOption { type = types.ints.unsigned; default = 16777216; description = "Most content bytes one agent's waiting approvals on this bridge may hold (beyond: refused with limit_reached); 0 = no limit."; };
    max_parked = mkOption { type = types.ints.unsigned; default = 0; description = "Most approvals waiting on this bridge in all; 0 = no limit."; };
    editors_count = mkOption { type = types.bool; default = false; description = "Under a quorum above 1, whether an approver who edited the message counts toward it (default: the editor proposes, others dispose)."; };
    trust_surfaces = mkOption { type = types.bool; default = false; description = "Under a quorum above 1, whether several people answering through one service password (the notify bridge's ingest, the page) count apart (default: one password counts once)."; };
    max_snooze = mkOption { type = types.ints.unsigned; default = 86400; description = "Longest one \"later\" may move an approval's deadline by, in seconds; 0 = approvers cannot snooze."; };
    max_snoozes = mkOption { type = types.ints.unsigned; default = 3; description = "How many times one approval may be snoozed."; };
    digest = mkOption { type = types.nullOr (types.enum [ "hourly" "daily" ]); default = null; description = "A summary of what waits on this bridge, oldest first, once an hour or a day while anything does."; };
    digest_to = mkOption { type = types.nullOr types.str; default = null; description = "Bridge the digest is sent through (default: the notify bridge); it must not itself ask for approval."; };
    digest_channel = mkOption { type = types.str; default = ""; description = "Where the digest goes on that bridge (on its destinations)."; };
    also = mkOption {
      type = types.listOf (types.submodule { options = {
        notify = mkOption { type = types.str; description = "Bridge that shows this card."; };
        notify_channel = mkOption { type = types.str; description = "Where on that bridge (on its destinations)."; };
      }; });
      default = [ ];
      description = "More surfaces asked at the same time as notify, one card each; an answer on any of them counts.";
    };
    escalate = mkOption {
      type = types.listOf (types.submodule { options = {
        after = mkOption { type = types.ints.positive; description = "Seconds after parking when this step is taken, if still undecided (each step later than the one before, and before the timeout)."; };
        notify = mkOption { type = types.str; description = "Bridge asked from this step on."; };
        notify_channel = mkOption { type = types.str; description = "Where on that bridge (on its destinations)."; };
        approvers = mkOption { type = types.listOf types.str; default = [ ]; description = "Who may decide from this step on, besides the approvers before."; };
        people = mkOption { type = types.listOf types.str; default = [ ]; description = "People (services.cowboy.people) who may decide from this step on, with every identity they have."; };
      }; });
      default = [ ];
      description = "The escalation ladder: each step asks one more surface, and lets its approvers answer, once its time passes undecided.";
    };
    remind_after = mkOption { type = types.ints.unsigned; default = 0; description = "Seconds after parking when the card's surface reminds the approvers of an approval still waiting (once); 0 = never."; };
    snooze = mkOption { type = types.ints.positive; default = 3600; description = "Seconds a \"later\" without a time (a reaction, a button) moves the deadline by."; };
  };

  # The alias keeps the protocol's second spelling; null means "not set here".
  aliasApprovalOptions = mapAttrs (_: o: mkOption { type = types.nullOr o.type; default = null; description = o.description; }) approvalOptions;

  bridgeModule = { name, ... }: {
    options = {
      enable = mkEnableOption "the cowboy bridge ${name}" // { default = true; };
      type = mkOption { type = types.enum (attrNames registry); description = "Platform of this bridge: " + lib.concatStringsSep "; " (mapAttrsToList (t: k: "${t}: ${k.about}") registry) + "."; };
      actions = mkOption {
        type = types.attrsOf (types.submodule {
          options = {
            repo = mkOption { type = types.str; description = "The git repository whose commit an approval binds (agents must not be able to write its config)."; };
            command = mkOption { type = types.listOf types.str; description = "argv, run without a shell; `{sha}` and `{PARAM}` are replaced by the approved values."; };
            params = mkOption { type = types.attrsOf types.str; default = { }; description = "Named params the agent gives, each with the pattern its whole value must match."; };
            timeout = mkOption { type = types.ints.positive; default = 300; description = "Seconds before the command is killed (its whole process group)."; };
            env = mkOption { type = types.attrsOf types.str; default = { }; description = "The command's whole environment (nothing is inherited)."; };
            target = mkOption { type = types.nullOr types.str; default = null; description = "What approvers see the commit against (`git log TARGET..SHA`), e.g. origin/main."; };
            idempotent = mkOption { type = types.bool; default = false; description = "Run again after a crash cut a run off (otherwise it is reported uncertain)."; };
          };
        });
        default = { };
        description = "Effects bridges: what agents may ask for, by name.";
      };
      approval = approvalOptions;
      destinations = mkOption { type = types.listOf types.str; default = [ ]; description = "Allowed channel_id values (`*` globs). Empty: nothing may be sent."; };
      max_content_bytes = mkOption { type = types.ints.positive; default = 65536; description = "Largest accepted content."; };
      batch = mkOption { type = types.ints.positive; default = 64; description = "Outbox entries read per round trip."; };
      max_in_flight = mkOption { type = types.ints.positive; default = 32; description = "Deliveries under way at once (one per destination at a time)."; };
      max_attempts = mkOption { type = types.ints.positive; default = 50; description = "Attempts at a delivery that keeps failing transiently before it is dead-lettered."; };
      max_retry_seconds = mkOption { type = types.ints.positive; default = 3600; description = "Seconds after its first failure that such a delivery is given up."; };
      claim_idle_seconds = mkOption { type = types.ints.positive; default = 60; description = "Seconds a worker may go without reading or beating before another worker takes over its entries."; };
      max_deliveries = mkOption { type = types.ints.between 2 1000000; default = 10; description = "Times an entry may be handed to a worker without an outcome before it is dead-lettered as poison (parked entries exempt)."; };
      retention_seconds = mkOption { type = types.ints.unsigned; default = 86400; description = "Seconds of handled history kept in the outbox streams and inboxes (never what a group still needs); 0 keeps everything."; };
      dead_letter_retention_seconds = mkOption { type = types.ints.unsigned; default = 2592000; description = "Seconds dead letters are kept; 0 keeps them forever."; };
      outboxWorkers = mkOption {
        # `worker` is the default worker's name: a second unit under it would share its pending list.
        type = types.listOf (types.addCheck (types.strMatching "[A-Za-z0-9_-]{1,64}") (w: w != "worker")); default = [ ];
        example = [ "b" "c" ];
        description = "Extra outbox workers, each a unit cowboy-NAME-outbox-WORKER run with `--worker WORKER` beside the default one; a dead one's entries are taken over by the others.";
      };
      ping = {
        command = mkOption { type = types.listOf types.str; default = [ ]; description = "argv run once per burst of inbox entries."; };
        debounce_ms = mkOption { type = types.ints.unsigned; default = 250; description = "How long a burst is gathered."; };
      };
      settings = mkOption {
        type = (pkgs.formats.toml { }).type; default = { };
        example = literalExpression ''{ channels = [ "123" ]; dms = false; }'';
        description = "The bridge type's own keys (see docs/bridges.md). Secrets do not belong here: use `tokenFile`/`secrets`.";
      };
      tokenFile = mkOption { type = types.nullOr types.path; default = null; description = "File with the platform token (rendered as token_file, passed with LoadCredential)."; };
      secrets = mkOption {
        type = types.attrsOf types.path; default = { };
        example = { "smtp.password_file" = "/run/keys/smtp"; "imap.password_file" = "/run/keys/imap"; };
        description = "Secret files by config key; each reaches only this bridge's units, with LoadCredential.";
      };
      redisPasswordFiles = mkOption {
        type = types.attrsOf types.path; default = { };
        description = "Password file of each service's Redis user (ingest, outbox, ping).";
      };
    };
  };

  bridgeInput = name: b: {
    inherit (b) type approval destinations max_content_bytes batch max_in_flight max_attempts max_retry_seconds claim_idle_seconds max_deliveries retention_seconds dead_letter_retention_seconds ping redisPasswordFiles;
    settings = b.settings // optionalAttrs (b.type == "effects") { actions = mapAttrs (_: a: filterAttrs (_: v: v != null) a) b.actions; };
    secrets = b.secrets // optionalAttrs (b.tokenFile != null) { token_file = b.tokenFile; };
  };

  # dir = null renders the secrets' source paths (for root-run tools).
  renderWith = dir: pkgs.writeText (if dir == null then "cowboy-operator.toml" else "cowboy.toml") (render {
    redis = { inherit (cfg.redis) url caFile clientCertFile clientKeyFile allowPlaintext sentinels masterName cluster sentinelUsername sentinelPasswordFile waitReplicas waitTimeoutMs; } // optionalAttrs cfg.redis.acl { username = cfg.redis.operator; passwordFile = cfg.redis.operatorPasswordFile; };
    agents = mapAttrs (_: a: { inherit (a) passwordFile; }) cfg.agents;
    operators = mapAttrs (_: o: { inherit (o) passwordFile; }) cfg.operators;
    people = mapAttrs (_: p: { inherit (p) identities; }) cfg.people;
    audit = { inherit (cfg.audit) retentionDays; };
    web = if cfg.web.enable || cfg.web.exporter.enable then {
      inherit (cfg.web) listen exporterListen sessionHours secureCookies sessionKeyFile redisPasswordFile exporterRedisPasswordFile trustedProxies publicUrl;
      users = mapAttrs (_: u: { inherit (u) passwordFile; }) cfg.web.users;
    } else null;
    bridges = mapAttrs bridgeInput enabledBridges;
    credentialsDirectory = dir;
  });
  # Units read secrets from their credentials directory; the operator CLI and
  # `cowboy acl` read the source files.
  serviceConfigFile = renderWith "$CREDENTIALS_DIRECTORY";
  operatorConfigFile = renderWith null;

  hardening = {
    CapabilityBoundingSet = "";
    LockPersonality = true;
    MemoryDenyWriteExecute = true;
    NoNewPrivileges = true;
    PrivateDevices = true;
    PrivateTmp = true;
    PrivateUsers = true;
    ProcSubset = "pid";
    ProtectClock = true;
    ProtectControlGroups = true;
    ProtectHome = true;
    ProtectHostname = true;
    ProtectKernelLogs = true;
    ProtectKernelModules = true;
    ProtectKernelTunables = true;
    ProtectProc = "invisible";
    ProtectSystem = "strict";
    RemoveIPC = true;
    RestrictAddressFamilies = [ "AF_INET" "AF_INET6" "AF_UNIX" ];
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    SystemCallArchitectures = "native";
    SystemCallFilter = [ "@system-service" "~@privileged @resources" ];
    UMask = "0077";
  };

  unitFor = name: b: svc: workerUnit name b svc null;

  # One unit per service; `worker` (outbox only) names an extra outbox worker.
  workerUnit = name: b: svc: worker: nameValuePair "cowboy-${name}-${svc}${optionalString (worker != null) "-${worker}"}" {
    description = "cowboy ${svc} of bridge ${name} (${b.type})";
    partOf = [ "cowboy.target" ];
    wantedBy = [ "cowboy.target" ];
    after = [ "network-online.target" ] ++ optional cfg.redis.createLocally "redis-cowboy.service";
    wants = [ "network-online.target" ];
    requires = optional cfg.redis.createLocally "redis-cowboy.service";
    environment = optionalAttrs (b.redisPasswordFiles ? ${svc}) {
      COWBOY_REDIS_USERNAME = "cowboy-${name}-${svc}";
      COWBOY_REDIS_PASSWORD_FILE = "%d/redis-password";
    };
    # The rebuild outbox runs nixos-rebuild: root, without the sandbox.
    serviceConfig = mapAttrs (_: mkDefault) (if b.type == "rebuild" && svc == "outbox" then { PrivateTmp = true; } else hardening) // {
      Type = "notify";
      NotifyAccess = "main";
      ExecStart = "${cfg.package}/bin/cowboy-${b.type}-${svc} --config ${serviceConfigFile} --bridge ${name}${optionalString (worker != null) " --worker ${worker}"}";
      WatchdogSec = 30;
      Restart = "always";
      RestartSec = 2;
      RestartSteps = 6;
      RestartMaxDelaySec = 120;
      RestartPreventExitStatus = 78;
      # An effects bridge works in its actions' repositories.
      ReadWritePaths = optionals (b.type == "effects") (mapAttrsToList (_: a: a.repo) b.actions);
      # The console bridge shares files between its units, so it runs as one static user.
      DynamicUser = b.type != "console" && !(b.type == "rebuild" && svc == "outbox");
      User = mkIf (b.type == "console" || (b.type == "rebuild" && svc == "outbox")) (if b.type == "console" then "cowboy" else "root");
      # A rebuild outbox (root) keeps its checkout in a directory of its own,
      # which no sandboxed unit's user can be given.
      StateDirectory = if b.type == "rebuild" && svc == "outbox" then "cowboy-rebuild-${name}" else "cowboy";
      StateDirectoryMode = if b.type == "rebuild" && svc == "outbox" then "0700" else "0750";
      LoadCredential =
        optional (b.redisPasswordFiles ? ${svc}) "redis-password:${b.redisPasswordFiles.${svc}}"
        ++ optional (cfg.redis.sentinelPasswordFile != null) "redis-sentinel-password:${cfg.redis.sentinelPasswordFile}"
        ++ optional (cfg.redis.clientKeyFile != null) "redis-client-key:${cfg.redis.clientKeyFile}"
        ++ mapAttrsToList (k: path: "${k}:${path}") (bridgeInput name b).secrets;
    };
  };

  # The page and the exporter: one hardened unit each, with their own Redis user.
  webUnit = arg: {
    description = if arg == "serve" then "cowboy approval page" else "cowboy metrics exporter";
    partOf = [ "cowboy.target" ];
    wantedBy = [ "cowboy.target" ];
    after = [ "network-online.target" ] ++ optional cfg.redis.createLocally "redis-cowboy.service";
    wants = [ "network-online.target" ];
    serviceConfig = mapAttrs (_: mkDefault) hardening // {
      Type = "notify";
      NotifyAccess = "main";
      ExecStart = "${cfg.package}/bin/cowboy-web --config ${serviceConfigFile} ${arg}";
      WatchdogSec = 30;
      Restart = "always";
      RestartSec = 2;
      RestartPreventExitStatus = 78;
      DynamicUser = true;
      LoadCredential =
        optional (arg == "serve" && cfg.web.redisPasswordFile != null) "web-redis-password:${cfg.web.redisPasswordFile}"
        ++ optional (arg == "exporter" && cfg.web.exporterRedisPasswordFile != null) "web-exporter-password:${cfg.web.exporterRedisPasswordFile}"
        ++ optional (cfg.web.sessionKeyFile != null) "web-session-key:${cfg.web.sessionKeyFile}"
        ++ optional (cfg.redis.sentinelPasswordFile != null) "redis-sentinel-password:${cfg.redis.sentinelPasswordFile}"
        ++ optional (cfg.redis.clientKeyFile != null) "redis-client-key:${cfg.redis.clientKeyFile}"
        ++ mapAttrsToList (n: u: "web-user-${n}:${u.passwordFile}") cfg.web.users;
    };
  };

  inlineSecrets = import ./secrets.nix;
in
{
  options.services.cowboy = {
    enable = mkEnableOption "cowboy, the Redis Streams message bridges between agents and the world";
    package = mkOption { type = types.package; description = "The cowboy workspace (binaries cowboy and cowboy-<type>-<service>)."; };

    redis = {
      createLocally = mkOption { type = types.bool; default = true; description = "Run a dedicated services.redis.servers.cowboy."; };
      port = mkOption { type = types.port; default = 6390; description = "Port of the dedicated Redis."; };
      url = mkOption { type = types.str; default = "redis://127.0.0.1:${toString cfg.redis.port}"; defaultText = literalExpression ''"redis://127.0.0.1:''${toString port}"''; description = "Redis to use (an external one when createLocally is false)."; };
      caFile = mkOption { type = types.nullOr types.path; default = null; description = "PEM certificates of the CA that signed the Redis server's certificate, trusted for a rediss:// url instead of the system's roots."; };
      clientCertFile = mkOption { type = types.nullOr types.path; default = null; description = "PEM certificate shown to Redis servers (and Sentinels) that verify clients (tls-auth-clients yes)."; };
      clientKeyFile = mkOption { type = types.nullOr types.path; default = null; description = "Its PEM private key (every unit receives it with LoadCredential)."; };
      allowPlaintext = mkOption { type = types.bool; default = false; description = "Allow redis:// (no TLS) to a host that is not loopback (passwords and messages then cross the network in clear)."; };
      sentinels = mkOption { type = types.listOf types.str; default = [ ]; example = [ "rediss://10.0.0.1:26379" "rediss://10.0.0.2:26379" "rediss://10.0.0.3:26379" ]; description = "Sentinels that say where the master is (instead of url; set createLocally = false). The master is reached with their scheme."; };
      masterName = mkOption { type = types.nullOr types.str; default = null; description = "The name the Sentinels monitor the master under."; };
      cluster = mkOption { type = types.listOf types.str; default = [ ]; example = [ "rediss://10.0.0.1:6379" "rediss://10.0.0.2:6379" "rediss://10.0.0.3:6379" ]; description = "Nodes of a Redis Cluster to learn it from (instead of url and sentinels; set createLocally = false). Load the rendered ACL users file on every node."; };
      sentinelUsername = mkOption { type = types.nullOr types.str; default = null; description = "ACL user on the Sentinels, where they have one."; };
      sentinelPasswordFile = mkOption { type = types.nullOr types.path; default = null; description = "Password file of that user (every unit receives it with LoadCredential)."; };
      waitReplicas = mkOption { type = types.ints.unsigned; default = 0; description = "Replicas that must hold an approval record, a decision and a send's gate mark before the step that relies on it (WAIT); 0: none. Keep at least one more replica than this, or the gate stops while one is down."; };
      waitTimeoutMs = mkOption { type = types.ints.between 1 5000; default = 1000; description = "How long such a WAIT may take before the step fails and is retried."; };
      acl = mkOption { type = types.bool; default = true; description = "Render ACL users with `cowboy acl` and turn the default user off."; };
      operator = mkOption { type = types.str; default = "cowboy-admin"; description = "Redis user of the operator CLI."; };
      operatorPasswordFile = mkOption { type = types.nullOr types.path; default = null; description = "Password file of the operator user."; };
    };

    web = {
      enable = mkEnableOption "the approval page (cowboy web, its own hardened unit and Redis user)";
      exporter.enable = mkEnableOption "cowboy exporter: /metrics alone, for hosts without the page";
      listen = mkOption { type = types.str; default = "127.0.0.1:8787"; description = "address:port of the page; keep it on loopback and put a TLS reverse proxy in front."; };
      exporterListen = mkOption { type = types.str; default = "127.0.0.1:9787"; description = "address:port of `cowboy exporter`."; };
      users = mkOption {
        type = types.attrsOf (types.submodule {
          options.passwordFile = mkOption { type = types.path; description = "File holding the Argon2 hash `cowboy web hash-password` prints (not the password)."; };
        });
        default = { };
        description = "Who may log in; each decides as approver `web:NAME` where listed in a bridge's approvers.";
      };
      sessionHours = mkOption { type = types.ints.positive; default = 8; description = "How long a login lasts."; };
      sessionKeyFile = mkOption { type = types.nullOr types.path; default = null; description = "Key (32+ bytes) sessions are signed with; null: a random key per start (a restart logs everyone out)."; };
      secureCookies = mkOption { type = types.bool; default = false; description = "Mark cookies Secure (set it when a TLS proxy serves the page)."; };
      redisPasswordFile = mkOption { type = types.nullOr types.path; default = null; description = "Password of the page's Redis user cowboy-web (needed with redis.acl)."; };
      trustedProxies = mkOption { type = types.listOf types.str; default = [ ]; example = [ "127.0.0.1" ]; description = "Addresses of the reverse proxies in front of the page; from them the client is the X-Forwarded-For address (failed logins are counted per client)."; };
      publicUrl = mkOption { type = types.nullOr types.str; default = null; example = "https://approvals.example.org"; description = "The page's address as approvers reach it, for links in digests."; };
      exporterRedisPasswordFile = mkOption { type = types.nullOr types.path; default = null; description = "Password of the exporter's read-only Redis user cowboy-exporter (needed with redis.acl and exporter.enable)."; };
    };

    audit.retentionDays = mkOption {
      type = types.ints.positive; default = 90;
      description = "Days the audit trail (`<bridge>:audit`: every step of every approval) keeps an entry.";
    };
    people = mkOption {
      type = types.attrsOf (types.submodule {
        options.identities = mkOption { type = types.listOf types.str; example = [ "cli:ann" "web:ann" "discord:80351110224678912" ]; description = "Every approver identity of this person, on every surface."; };
      });
      default = { };
      description = "The humans behind approver identities: a quorum counts people, so one person answering on two surfaces counts once. Under a quorum above 1 every approver must belong to one.";
    };
    operators = mkOption {
      type = types.attrsOf (types.submodule {
        options.passwordFile = mkOption { type = types.path; description = "The operator's Redis password file."; };
      });
      default = { };
      description = "People who decide with `cowboy approvals` as `cli:NAME`; each gets its own Redis user, and the CLI proves the name by connecting as it.";
    };

    agents = mkOption {
      type = types.attrsOf (types.submodule {
        options.passwordFile = mkOption { type = types.nullOr types.path; default = null; description = "The agent's Redis password file."; };
        options.mcp = mkOption { type = types.bool; default = true; description = "Render /etc/cowboy/mcp/<name>.json: the mcpServers entry that runs `cowboy mcp --agent <name>` (Claude Code, Claude Desktop, Cursor; Codex takes the same command and args). The agent's Unix user needs to read its passwordFile."; };
      });
      default = { };
      description = "Agents whose per-agent streams ({agent}:{bridge}:outbox|inbox) every bridge serves.";
    };

    bridges = mkOption { type = types.attrsOf (types.submodule bridgeModule); default = { }; description = "Bridges, by name."; };

    pubsub.sources = mkOption {
      type = types.attrsOf (types.submodule { options.approval = aliasApprovalOptions; });
      default = { };
      description = "Alias of services.cowboy.bridges.<name>.approval (the protocol's second spelling).";
    };
  };

  config = mkIf cfg.enable {
    services.cowboy.bridges = mapAttrs (_: s: { approval = filterAttrs (_: v: v != null) s.approval; }) cfg.pubsub.sources;

    assertions = concatMap (name:
      let
        b = cfg.bridges.${name};
        notify = if b.approval.notify == null then name else b.approval.notify;
        gated = registry.${b.type}.gated;
        required = if b.approval.required == null then gated else b.approval.required;
      in [
        { assertion = !(gated && b.approval.required == false); message = "services.cowboy.bridges.${name}.approval.required cannot be false on an ${b.type} bridge: every request waits for approval (leave it unset)."; }
        { assertion = b.type != "effects" || b.actions != { }; message = "services.cowboy.bridges.${name}.actions: an effects bridge needs at least one declared action."; }
        { assertion = !required || b.approval.notify_channel != ""; message = "services.cowboy.bridges.${name}.approval.required needs approval.notify_channel."; }
        { assertion = !required || b.approval.approvers != [ ]; message = "services.cowboy.bridges.${name}.approval.required needs at least one approver (type:id)."; }
        { assertion = enabledBridges ? ${notify}; message = "services.cowboy.bridges.${name}.approval.notify = \"${notify}\" names no enabled bridge."; }
        { assertion = inlineSecrets b.settings == [ ]; message = "services.cowboy.bridges.${name}.settings holds a secret inline (${toString (inlineSecrets b.settings)}); use tokenFile or secrets, which stay out of the Nix store."; }
        { assertion = !cfg.redis.acl || builtins.all (s: b.redisPasswordFiles ? ${s}) services; message = "services.cowboy.bridges.${name}.redisPasswordFiles needs ingest, outbox and ping when redis.acl is on."; }
      ]) (attrNames enabledBridges)
      ++ [
        { assertion = !cfg.redis.acl || cfg.redis.operatorPasswordFile != null; message = "services.cowboy.redis.operatorPasswordFile is needed when redis.acl is on (the default user is turned off)."; }
        { assertion = !cfg.redis.acl || builtins.all (a: a.passwordFile != null) (builtins.attrValues cfg.agents); message = "every services.cowboy.agents.<name>.passwordFile is needed when redis.acl is on."; }
        { assertion = !(cfg.redis.acl && cfg.web.enable) || cfg.web.redisPasswordFile != null; message = "services.cowboy.web.redisPasswordFile is needed when redis.acl is on (the page has its own Redis user)."; }
        { assertion = !(cfg.redis.acl && cfg.web.exporter.enable) || cfg.web.exporterRedisPasswordFile != null; message = "services.cowboy.web.exporterRedisPasswordFile is needed when redis.acl is on (the exporter has its own read-only Redis user)."; }
        { assertion = cfg.redis.sentinels == [ ] || (!cfg.redis.createLocally && cfg.redis.masterName != null); message = "services.cowboy.redis.sentinels needs masterName and createLocally = false (the Sentinels' master is not the local Redis)."; }
        { assertion = cfg.redis.cluster == [ ] || (!cfg.redis.createLocally && cfg.redis.sentinels == [ ]); message = "services.cowboy.redis.cluster needs createLocally = false and no sentinels (a cluster fails over by itself)."; }
      ];

    users.users.cowboy = { isSystemUser = true; group = "cowboy"; };
    users.groups.cowboy = { };

    environment.systemPackages = [ cfg.package ];
    environment.etc = { "cowboy/cowboy.toml".source = operatorConfigFile; }
      // mapAttrs' (name: _: nameValuePair "cowboy/mcp/${name}.json" {
        text = builtins.toJSON {
          mcpServers.cowboy = {
            command = "${cfg.package}/bin/cowboy";
            args = [ "--config" "/etc/cowboy/cowboy.toml" "mcp" "--agent" name ];
          };
        };
      }) (filterAttrs (_: a: a.mcp) cfg.agents);

    services.redis.servers.cowboy = mkIf cfg.redis.createLocally {
      enable = true;
      port = cfg.redis.port;
      bind = "127.0.0.1";
      save = [ ];
      # Approval records hold values up to a few hundred bytes (the 200-character
      # preview): a compact listpack up to 512 bytes per value keeps a record at
      # about a third of the memory of a hash table.
      settings = { hash-max-listpack-value = 512; } // optionalAttrs cfg.redis.acl { aclfile = "/run/cowboy-acl/users.acl"; };
    };

    systemd.services = {
      # Renders the users file from the secret files before Redis starts; only
      # password hashes land in it.
      cowboy-acl = mkIf (cfg.redis.createLocally && cfg.redis.acl) {
        description = "Render the cowboy Redis ACL users file";
        before = [ "redis-cowboy.service" ];
        requiredBy = [ "redis-cowboy.service" ];
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
          RuntimeDirectory = "cowboy-acl";
          RuntimeDirectoryPreserve = true;
        };
        script = ''
          ${cfg.package}/bin/cowboy --config ${operatorConfigFile} acl > /run/cowboy-acl/users.acl
          chmod 0644 /run/cowboy-acl/users.acl
        '';
      };
    } // builtins.listToAttrs (concatMap (name: map (unitFor name enabledBridges.${name}) services) (attrNames enabledBridges))
      // builtins.listToAttrs (concatMap (name: let b = enabledBridges.${name}; in map (workerUnit name b "outbox") b.outboxWorkers) (attrNames enabledBridges))
      // optionalAttrs cfg.web.enable { cowboy-web = webUnit "serve"; }
      // optionalAttrs cfg.web.exporter.enable { cowboy-exporter = webUnit "exporter"; };

    systemd.targets.cowboy = {
      description = "cowboy bridges";
      wantedBy = [ "multi-user.target" ];
    };
  };
}
