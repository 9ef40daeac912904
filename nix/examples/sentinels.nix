# Behind three Sentinels over TLS: every unit finds the master through them,
# follows a failover, and waits for one replica before the steps that rely on
# a write (see docs/deployment.md, "Redis behind Sentinels").
{
  redis = {
    sentinels = [ "rediss://10.0.0.1:26379" "rediss://10.0.0.2:26379" "rediss://10.0.0.3:26379" ];
    masterName = "cowboy";
    caFile = "/etc/cowboy/redis-ca.pem";
    sentinelUsername = "cowboy-sentinel";
    sentinelPasswordFile = "/etc/cowboy/secrets/sentinel";
    waitReplicas = 1;
    waitTimeoutMs = 500;
    username = "cowboy-admin";
    passwordFile = "/etc/cowboy/secrets/admin";
  };
  bridges.local = {
    type = "console";
    settings = { output = "/var/lib/cowboy/local.out"; input = "/var/lib/cowboy/local.in"; };
  };
}
